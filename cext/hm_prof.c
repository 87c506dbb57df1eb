/* hybridmpi C core: the profile's clock (hybridmpi.profile): a recorded call's
 * begin and end stamps, and the stamps of the wait inside it (hm_prof[0..1], which
 * the waits of hm_wait.h set), appended to the call's log.  See hm_core.h for the
 * contract of each exported function. */
#define _GNU_SOURCE
#include "hm_wait.h"

#include <stdint.h>
#include <stdlib.h>

int64_t hm_prof[3];
int hm_prof_nest = 0;

#define HM_PROF_DEPTH 16
static int64_t prof_t0[HM_PROF_DEPTH];
static int prof_depth = 0;

void hm_prof_begin(void)
{
    if (prof_depth < HM_PROF_DEPTH)
        prof_t0[prof_depth] = now_ns();
    prof_depth++;
    hm_prof[0] = hm_prof[1] = 0;
}

void hm_prof_abort(void)
{
    if (prof_depth > 0)
        prof_depth--;
}

int hm_prof_end_bytes(hm_prof_log *log, int64_t nbytes)
{
    int64_t t1 = now_ns(), a = hm_prof[0], b = hm_prof[1];
    /* an end without its begin (depth 0) times nothing, never reads prof_t0[-1]; calls nested
     * deeper than HM_PROF_DEPTH share the deepest stamp */
    int deepest = prof_depth > HM_PROF_DEPTH ? HM_PROF_DEPTH : prof_depth;
    int64_t t0 = deepest > 0 ? prof_t0[deepest - 1] : t1;
    if (prof_depth > 0)
        prof_depth--;
    if (log->n == log->cap && log->n < log->limit) {
        int64_t cap = log->cap ? 2 * log->cap : 1024;
        if (cap > log->limit)
            cap = log->limit;
        /* cap records of 6 words: a limit past what size_t holds fails as out of memory */
        int64_t *rec = (uint64_t)cap > SIZE_MAX / (6 * sizeof(int64_t))
                           ? NULL : realloc(log->rec, (size_t)cap * 6 * sizeof(int64_t));
        if (rec != NULL) {
            log->rec = rec;
            log->cap = cap;
        }
    }
    if (log->n == log->cap) {
        log->over[0] += 1;
        log->over[1] += nbytes;
        log->over[2] += t1 - t0;
        log->over[3] += (a && b >= a) ? b - a : 0;
        return log->n < log->limit ? -1 : 0;
    }
    int64_t *r = log->rec + 6 * log->n++;
    r[0] = t0;
    r[1] = a;
    r[2] = b;
    r[3] = t1;
    r[4] = 0;
    r[5] = nbytes;
    return 0;
}

int hm_prof_end(hm_prof_log *log) { return hm_prof_end_bytes(log, log->nbytes); }

void hm_prof_free(hm_prof_log *log)
{
    free(log->rec);
    log->rec = NULL;
    log->n = log->cap = 0;
}

