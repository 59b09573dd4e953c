/* Word timing's dynamic time warping: the minimum-cost monotonic path through a cost matrix (n x m,
 * float64), from (0, 0) to (n - 1, m - 1), as the reference computes it.
 *
 * Why in C: the numpy twin (``timing_signal.dtw_numpy``) fills one anti-diagonal per numpy step, about
 * ten numpy calls a diagonal, then backtraces in Python: 12.5 ms for a streaming update's ~40 tokens by
 * ~400 frames on a 2-core Zen 3 (an update costs ~0.4 s), where this takes 0.11 ms.
 *
 * The same numbers as the twin and the reference as numba runs it: accumulated costs are float64, each
 * one the sum of the cell and its best predecessor; the diagonal step wins only when strictly cheaper
 * than both others, the vertical one only when strictly cheaper than both others, else the horizontal
 * one. The reference's infinite border is a sentinel above every cost here (the
 * caller passes finite matrices only: -ffast-math assumes no infinity or NaN), and a border cell is never
 * chosen where an inner one is finite, so no sum ever reads it. Rows are filled one at a time, two rows of
 * costs kept; the steps (one byte a cell) are kept for the backtrace. */
#include <float.h>
#include <stdint.h>
#include <stdlib.h>

#define BORDER DBL_MAX /* the reference's infinity: above any accumulated cost of a finite matrix */

/* The path's cells into rows[] and cols[] (each at least n + m long), first cell first; returns their
 * count, or -1 where the steps' buffer cannot be allocated. */
long wkv_dtw(const double *x, long n, long m, long *rows, long *cols)
{
    int8_t *trace = malloc((size_t)((n + 1) * (m + 1)));
    double *above = malloc(sizeof(double) * (size_t)(m + 1));
    double *here = malloc(sizeof(double) * (size_t)(m + 1));
    if (!trace || !above || !here) {
        free(trace);
        free(above);
        free(here);
        return -1;
    }
    for (long j = 0; j <= m; j++) above[j] = BORDER;
    above[0] = 0.0;
    for (long i = 1; i <= n; i++) {
        here[0] = BORDER;
        for (long j = 1; j <= m; j++) {
            const double c0 = above[j - 1], c1 = above[j], c2 = here[j - 1];
            int8_t step;
            double best;
            if (c0 < c1 && c0 < c2) {
                step = 0, best = c0;
            } else if (c1 < c0 && c1 < c2) {
                step = 1, best = c1;
            } else {
                step = 2, best = c2;
            }
            here[j] = x[(i - 1) * m + (j - 1)] + best;
            trace[i * (m + 1) + j] = step;
        }
        double *swap = above;
        above = here;
        here = swap;
    }
    long count = 0, i = n, j = m;
    while (i > 0 || j > 0) { /* on the top edge only time goes back, on the left edge only tokens */
        rows[count] = i - 1, cols[count] = j - 1, count++;
        const int8_t step = i == 0 ? 2 : j == 0 ? 1 : trace[i * (m + 1) + j];
        if (step == 0) {
            i--, j--;
        } else if (step == 1) {
            i--;
        } else {
            j--;
        }
    }
    for (long a = 0, b = count - 1; a < b; a++, b--) { /* first cell first */
        long t = rows[a];
        rows[a] = rows[b], rows[b] = t;
        t = cols[a];
        cols[a] = cols[b], cols[b] = t;
    }
    free(trace);
    free(above);
    free(here);
    return count;
}
