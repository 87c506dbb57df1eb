/* hybridmpi C core: chaos, the drift tests' delays at the protocol points
 * (HYBRIDMPI_CHAOS), which hm_wait.h's CHAOS() calls.  See hm_core.h for
 * the contract of each exported function. */
#define _GNU_SOURCE
#include "hm_wait.h"

#include <sched.h>
#include <stdint.h>
#include <time.h>

int hm_chaos_on = 0;
static uint64_t chaos_state = 1;
static int64_t chaos_max_ns = 0;

void hm_set_chaos(uint64_t seed, int64_t max_ns)
{
    chaos_state = seed * 0x9E3779B97F4A7C15ULL + 1;
    chaos_max_ns = max_ns;
    hm_chaos_on = max_ns > 0;
}

/* One protocol point under chaos: most pass at once; some yield, some
 * spin a little, some sleep up to chaos_max_ns (a xorshift generator, one
 * per process, so each rank drifts its own way). */
void hm_chaos_delay(void)
{
    uint64_t x = chaos_state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    chaos_state = x;
    switch (x & 15) {
    case 0: {
        struct timespec ts = {0, (long)((x >> 8) % (uint64_t)chaos_max_ns)};
        nanosleep(&ts, NULL);
        break;
    }
    case 1:
    case 2:
        sched_yield();
        break;
    case 3:
        for (uint64_t i = (x >> 8) % 2000; i > 0; i--)
            cpu_relax();
        break;
    default:
        break;
    }
}
