/* hybridmpi C core: the state every wait shares (hm_wait.h): the progress
 * and warning hooks and the signals that end a wait.  The collectives, the
 * ghost exchange and global memory all wait through hm_wait.h, so each links
 * with this unit (and hm_prof.c, hm_chaos.c: the profile's clock and the
 * drift tests' delays, which the waits call) alone.  See hm_core.h for the
 * contract of each exported function. */
#define _GNU_SOURCE
#include "hm_wait.h"

#include <signal.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ hooks */

void (*hm_progress_hook)(void) = NULL;

void hm_set_progress(void (*fn)(void)) { hm_progress_hook = fn; }

/* ------------------------------------------------------------------ interrupts */

volatile sig_atomic_t hm_signal = 0;
_Atomic int hm_in_wait = 0;

static void on_signal(int sig)
{
    if (atomic_load_explicit(&hm_in_wait, memory_order_relaxed)) {
        hm_signal = sig;
        return;
    }
    /* outside the library's waits: what the default action would have done */
    signal(sig, SIG_DFL);
    raise(sig);
}

int hm_catch_signal(int sig)
{
    struct sigaction old, sa;
    if (sigaction(sig, NULL, &old) != 0 || old.sa_handler != SIG_DFL)
        return 0;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    return sigaction(sig, &sa, NULL) == 0;
}

void hm_interrupt(int sig) { hm_signal = sig; }

int hm_interrupted(void) { return hm_signal; }

int hm_wait_tick(int on)
{
    atomic_store_explicit(&hm_in_wait, on, memory_order_relaxed);
    return hm_signal;
}

void (*hm_warn_hook)(const void *, uint64_t, uint64_t, double) = NULL;

void hm_set_warn(void (*fn)(const void *, uint64_t, uint64_t, double)) { hm_warn_hook = fn; }
