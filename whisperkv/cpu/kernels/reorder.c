/* Beams follow their parents: one call moves every layer's Self-KV rows for a beam step.
 *
 * After a beam step, row i of every layer's keys and values must hold what row parent[i] held. Most
 * rows keep their own prefix; the others are rewritten from a copy of their parents' rows. From Python
 * that was two tensor operations per moved row, per layer, for keys and values (a batched beam-5 step
 * of tiny.en: 5 windows' rows, 120 operations, 1.3 ms). Here one call makes the same copies in the same
 * way (cpu/reorder.py; its twin is SelfKV.reorder, row by row from Python): every parent row is read
 * into `scratch` before any row is written, so swaps and repeated parents read what was held before.
 * Built by cpu/build.py with the other kernels. */
#include <string.h>

/* buffers: n_buffers tensors of one shape [B, H, capacity, width] (a layer's keys, a layer's values).
 * sb, sh: the byte strides of a row and of a head; bytes: the bytes a head holds for the positions held.
 * moves: n_moves pairs (row, parent), each row at most once. scratch: n_moves * H * bytes.
 *
 * Each row is copied once, in an order that needs no scratch: a row is written only when no pending
 * move still reads it (a chain 4 <- 3 <- 2 <- 1 <- 0 is copied from its end). Where only cycles are
 * left (a swap), one row of one is saved to scratch first and its readers read the saved copy. Every
 * read is of what the rows held before the call. (It copied every parent to scratch and back: twice the
 * bytes, 0.5 ms of a beam-5 step of tiny.en on a 150-position prefix.) */
void wkv_reorder_rows(char *const *buffers, long n_buffers, long sb, long sh, long H, long bytes,
                      const long *moves, long n_moves, char *scratch)
{
    if (n_moves < 1) return;
    long source[n_moves], saved[n_moves], order[n_moves], n_saved = 0, n_ordered = 0;
    char done[n_moves];
    for (long m = 0; m < n_moves; m++) {
        source[m] = moves[2 * m + 1]; /* a row, or -(slot + 1): a row saved to scratch slot */
        done[m] = 0;
    }
    while (n_ordered < n_moves) {
        long progress = 0;
        for (long m = 0; m < n_moves; m++) {
            if (done[m]) continue;
            long blocked = 0;
            for (long k = 0; k < n_moves && !blocked; k++)
                blocked = !done[k] && k != m && source[k] == moves[2 * m];
            if (!blocked) {
                order[n_ordered++] = m;
                done[m] = 1;
                progress = 1;
            }
        }
        if (!progress) { /* only cycles: save the first pending move's row (never written yet) */
            long m = 0;
            while (done[m]) m++;
            const long row = moves[2 * m], slot = n_saved++;
            saved[slot] = row;
            for (long k = 0; k < n_moves; k++)
                if (!done[k] && source[k] == row) source[k] = -(slot + 1);
        }
    }
    for (long b = 0; b < n_buffers; b++) {
        char *base = buffers[b];
        for (long slot = 0; slot < n_saved; slot++)
            for (long h = 0; h < H; h++)
                memcpy(scratch + (slot * H + h) * bytes, base + saved[slot] * sb + h * sh, bytes);
        for (long i = 0; i < n_moves; i++) {
            const long m = order[i], from = source[m];
            for (long h = 0; h < H; h++) {
                const char *in = from >= 0 ? base + from * sb + h * sh : scratch + ((-from - 1) * H + h) * bytes;
                memcpy(base + moves[2 * m] * sb + h * sh, in, bytes);
            }
        }
    }
}
