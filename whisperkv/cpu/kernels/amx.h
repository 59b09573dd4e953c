/* AMX (Intel's tile unit) for the kernels that use it: int8_rows.c (int8 tiles) and encoder_attend.c
 * (bfloat16 tiles). Each kernel file includes this; the state below is then each file's own, which is
 * harmless: asking Linux twice gets the same answer. */
#ifndef WKV_AMX_H
#define WKV_AMX_H
#if defined(__AMX_TILE__) && defined(__linux__)
#include <immintrin.h>
#include <stdint.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>
#define WKV_AMX_TILES 1

/* Linux hands out AMX's tile registers to a process that asks (arch_prctl). Asked once: the answer is
 * the process's for its life, and two threads asking at once get the same one. */
static inline int amx_permitted(void)
{
    static int state; /* 0 not asked, 1 granted, -1 refused */
    if (!state) state = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) ? -1 : 1;
    return state > 0;
}

/* All eight tiles 16 rows x 64 bytes (the calling thread's; _tile_release() when done). */
static inline void amx_configure(void)
{
    struct {
        uint8_t palette, start, reserved[14];
        uint16_t colsb[16];
        uint8_t rows[16];
    } __attribute__((packed, aligned(64))) config;
    memset(&config, 0, sizeof config);
    config.palette = 1;
    for (int t = 0; t < 8; t++) {
        config.rows[t] = 16;
        config.colsb[t] = 64;
    }
    _tile_loadconfig(&config);
}
#endif
#endif
