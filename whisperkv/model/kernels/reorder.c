/* Beams follow their parents: one call moves every layer's Self-KV rows for a beam step.
 *
 * After a beam step, row i of every layer's keys and values must hold what row parent[i] held. Most
 * rows keep their own prefix; the others are rewritten from a copy of their parents' rows. From Python
 * that was two tensor operations per moved row, per layer, for keys and values (a batched beam-5 step
 * of tiny.en: 5 windows' rows, 120 operations, 1.3 ms). Here one call makes the same copies in the same
 * way (cache/reorder.py; its twin is SelfKV.reorder, row by row from Python): every parent row is read
 * into `scratch` before any row is written, so swaps and repeated parents read what was held before.
 * Built by model/attend_kernel.py with the other kernels. */
#include <string.h>

/* buffers: n_buffers tensors of one shape [B, H, capacity, width] (a layer's keys, a layer's values).
 * sb, sh: the byte strides of a row and of a head; bytes: the bytes a head holds for the positions held.
 * moves: n_moves pairs (row, parent). scratch: n_moves * H * bytes. */
void wkv_reorder_rows(char *const *buffers, long n_buffers, long sb, long sh, long H, long bytes,
                      const long *moves, long n_moves, char *scratch)
{
    for (long b = 0; b < n_buffers; b++) {
        char *base = buffers[b];
        for (long m = 0; m < n_moves; m++)
            for (long h = 0; h < H; h++)
                memcpy(scratch + (m * H + h) * bytes, base + moves[2 * m + 1] * sb + h * sh, bytes);
        for (long m = 0; m < n_moves; m++)
            for (long h = 0; h < H; h++)
                memcpy(base + moves[2 * m] * sb + h * sh, scratch + (m * H + h) * bytes, bytes);
    }
}
