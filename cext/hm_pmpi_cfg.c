/* hybridmpi's PMPI library: its settings, read once from the environment when the library
 * starts (strictly: a value the variable does not take is named on stderr and the safe value is
 * used), and its counters (HYBRIDMPI_PMPI_STATS=1 prints them at MPI_Finalize). */
#define _GNU_SOURCE
#include "hm_pmpi_common.h"
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

struct pmpi_cfg cfg;

static const char *const counter_names[C_NUM] = {
    "allreduce fast", "barrier fast", "allreduce passed on", "barrier passed on",
    "communicators set up", "set-ups that fell back", "calls that failed", "neighbor fast",
    "neighbor passed on", "allreduce mpi path", "barrier mpi path", "tables taken"};
_Atomic long counters[C_NUM];

/* HYBRIDMPI_TUNE, as the Python library reads it (auto, table, off, mpi; auto and table alike
 * here: a table where one is found, never a calibration); another value is named on stderr and
 * auto is used. */
static int tune_setting(void)
{
    const char *v = getenv("HYBRIDMPI_TUNE");
    if (v == NULL || *v == '\0' || strcasecmp(v, "auto") == 0 || strcasecmp(v, "table") == 0)
        return TUNE_AUTO;
    if (strcasecmp(v, "off") == 0)
        return TUNE_OFF;
    if (strcasecmp(v, "mpi") == 0)
        return TUNE_MPI;
    fprintf(stderr, "hybridmpi pmpi: HYBRIDMPI_TUNE=%s is not auto, table, off or mpi; using auto\n", v);
    return TUNE_AUTO;
}

/* Settings are parsed strictly: a value that is not what the variable takes is named on
 * stderr, and the safe value is used (the default for a number; for HYBRIDMPI_PMPI_OFF, off:
 * a setting that could make calls go fast never does so by mistake). */
static void bad_setting(const char *name, const char *v, const char *what, const char *kept)
{
    fprintf(stderr, "hybridmpi pmpi: %s=%s is not %s; using %s\n", name, v, what, kept);
}

static long env_long(const char *name, long dflt, long lo, long hi)
{
    const char *v = getenv(name);
    char *end;
    if (v == NULL || *v == '\0')
        return dflt;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (*end != '\0' || errno == ERANGE || x < lo || x > hi) {
        char what[96], kept[32];
        snprintf(what, sizeof what, "an integer from %ld to %ld", lo, hi);
        snprintf(kept, sizeof kept, "%ld", dflt);
        bad_setting(name, v, what, kept);
        return dflt;
    }
    return (long)x;
}

/* 1/0, true/false, yes/no, on/off (any case); else `bad`. */
static int env_bool(const char *name, int dflt, int bad)
{
    static const char *const yes[] = {"1", "true", "yes", "on"}, *const no[] = {"0", "false", "no", "off"};
    const char *v = getenv(name);
    if (v == NULL || *v == '\0')
        return dflt;
    for (int i = 0; i < 4; i++) {
        if (strcasecmp(v, yes[i]) == 0)
            return 1;
        if (strcasecmp(v, no[i]) == 0)
            return 0;
    }
    bad_setting(name, v, "one of 1/0, true/false, yes/no, on/off", bad ? "1" : "0");
    return bad;
}

static double env_seconds(const char *name)
{
    const char *v = getenv(name);
    char *end;
    if (v == NULL || *v == '\0')
        return 0.0;
    errno = 0;
    double x = strtod(v, &end);
    if (*end != '\0' || errno == ERANGE || !(x >= 0.0 && x <= 1e9)) {
        bad_setting(name, v, "a number of seconds from 0 to 1e9", "0 (no timeout)");
        return 0.0;
    }
    return x;
}

void pmpi_read_settings(void)
{
    cfg.off = env_bool("HYBRIDMPI_PMPI_OFF", 0, 1);
    cfg.stats = env_bool("HYBRIDMPI_PMPI_STATS", 0, 0);
    cfg.after = (int)env_long("HYBRIDMPI_PMPI_AFTER", 5, 0, INT_MAX - 1);
    cfg.max_bytes = (uint64_t)env_long("HYBRIDMPI_PMPI_MAX_BYTES", 2048, 0, 1 << 20);
    cfg.node_size = (int)env_long("HYBRIDMPI_PMPI_NODE_SIZE", 0, 0, INT_MAX);
    cfg.timeout_s = env_seconds("HYBRIDMPI_PMPI_TIMEOUT");
    cfg.fail_rank = (int)env_long("HYBRIDMPI_PMPI_FAIL_RANK", -1, -1, INT_MAX);
    cfg.adaptive = env_bool("HYBRIDMPI_PMPI_ADAPTIVE", 1, 1);
    cfg.ngh_bytes = (uint64_t)env_long("HYBRIDMPI_PMPI_NEIGHBOR_BYTES", 1 << 20, 0, 1L << 30);
    cfg.ngh_stage = (uint64_t)env_long("HYBRIDMPI_PMPI_NEIGHBOR_STAGE", 12288, 0, 1L << 30);
    cfg.tune = tune_setting();
}

void pmpi_print_counters(int world_usable)
{
    int rank = -1, size = 0, world = 0;
    if (world_usable)
        PMPI_Initialized(&world);
    if (world) {   /* a sessions program has no MPI_COMM_WORLD */
        PMPI_Comm_rank(MPI_COMM_WORLD, &rank);
        PMPI_Comm_size(MPI_COMM_WORLD, &size);
    }
    char line[512];
    int n = snprintf(line, sizeof line, "hybridmpi pmpi: rank %d of %d:", rank, size);
    for (int k = 0; k < C_NUM && n < (int)sizeof line; k++)
        n += snprintf(line + n, sizeof line - (size_t)n, "%s %ld %s", k ? "," : "",
                      atomic_load(&counters[k]), counter_names[k]);
    fprintf(stderr, "%s\n", line);
}
