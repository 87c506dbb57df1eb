/* hybridmpi's PMPI library: the tuning table a communicator's layout takes (docs/guide/tuning.md).
 *
 * The Python library writes the tables (`hybridmpi tune`, and the calibration a HybridComm runs
 * where it finds none) into a cache folder, one JSON file per host, MPI, thread level and
 * layout.  This file reads the same files without a JSON parser: a table carries its key as one
 * line of printable ASCII (`key_line`, hybridmpi/comm/tuning.py key_line), which is built here
 * the same way from what this process sees, and found in the file with its `format` and `path`
 * fields, each a plain string field of the outermost object that must occur once (and `radix`
 * and `direct_total`, numbers, at most once); the cache file is the one whose name holds the key line's FNV-1a
 * hash (tuning.file_name).  Anything else (a missing folder, a
 * foreign or damaged table, a named pipe, a file over 1 MiB) is no table; the library never
 * calibrates.  It does not check the JSON around the four fields (the Python library does):
 * a table edited by hand into something else that keeps them is taken by both or by this one
 * only, and either path gives the same results. */
#define _GNU_SOURCE
#include "hm_pmpi_common.h"
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <unistd.h>

#define TABLE_FORMAT "hybridmpi-tune/1"
#define TABLE_MAX_BYTES (1 << 20)   /* as tuning.MAX_BYTES */

/* Whitespace collapsed to single spaces, ends trimmed, in place (Python's " ".join(s.split())). */
static void collapse(char *s)
{
    char *w = s;
    for (char *r = s; *r; r++) {
        if (isspace((unsigned char)*r)) {
            if (w != s && w[-1] != ' ')
                *w++ = ' ';
        } else {
            *w++ = *r;
        }
    }
    if (w != s && w[-1] == ' ')
        w--;
    *w = '\0';
}

static int all_digits(const char *s)
{
    for (; *s; s++)
        if (!isdigit((unsigned char)*s))
            return 0;
    return 1;
}

/* The processor's model from /proc/cpuinfo, as tuning.host() reads it: the value of the first
 * "model name", "cpu model" or "processor<TAB>: " line that is not a number, else the last such
 * value, else "". */
static void cpu_model(char *out, size_t n)
{
    static const char *const keys[] = {"model name", "cpu model", "processor\t: "};
    char line[1024];
    out[0] = '\0';
    FILE *f = fopen("/proc/cpuinfo", "re");
    if (f == NULL)
        return;
    while (fgets(line, sizeof line, f) != NULL) {
        char *colon = strchr(line, ':');
        int match = 0;
        for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++)
            match |= strncasecmp(line, keys[k], strlen(keys[k])) == 0;
        if (!match || colon == NULL)
            continue;
        snprintf(out, n, "%s", colon + 1);
        collapse(out);
        if (out[0] && !all_digits(out))
            break;
    }
    fclose(f);
}

/* The MPI library's name as tuning.mpi_name() gives it: the first line of its version, its
 * unprintable characters dropped, its whitespace collapsed. */
static void mpi_words(char *out, size_t n)
{
    char version[MPI_MAX_LIBRARY_VERSION_STRING + 1] = "";
    int len = 0;
    if (PMPI_Get_library_version(version, &len) != MPI_SUCCESS)
        version[0] = '\0';
    size_t w = 0;
    for (const unsigned char *r = (const unsigned char *)version; *r && !strchr("\n\r\v\f\x1c\x1d\x1e", *r); r++)
        if ((*r >= ' ' && *r != 0x7f) || *r >= 0x80)   /* (a UTF-8 character: kept, made ? below) */
            if (w + 1 < n)
                out[w++] = (char)*r;
    out[w] = '\0';
    collapse(out);
}

static const char *level_word(int level)
{
    return level == MPI_THREAD_SINGLE ? "single" : level == MPI_THREAD_FUNNELED ? "funneled"
         : level == MPI_THREAD_SERIALIZED ? "serialized" : level == MPI_THREAD_MULTIPLE ? "multiple" : "?";
}

/* The key line of `l` on this host and MPI (tuning.key_line): printable ASCII, quotes and
 * backslashes made ?, one ? per UTF-8 character. */
static void key_line(const pmpi_layout *l, char *out, size_t n)
{
    struct utsname u;
    char model[512], mpi[MPI_MAX_LIBRARY_VERSION_STRING + 1], raw[2048];
    int level = MPI_THREAD_SINGLE;
    if (uname(&u) != 0)
        u.machine[0] = '\0';
    cpu_model(model, sizeof model);
    mpi_words(mpi, sizeof mpi);
    PMPI_Query_thread(&level);
    snprintf(raw, sizeof raw, "host=%s, %s, %ld CPUs;mpi=%s;thread_level=%s;ranks=%d;nodes=%d;"
             "per_node=%d,%d;cores=%d;oversubscribed=%d", u.machine, model[0] ? model : "unknown processor",
             sysconf(_SC_NPROCESSORS_ONLN), mpi, level_word(level), l->ranks, l->nodes, l->lo, l->hi,
             l->cores, l->oversubscribed != 0);
    size_t w = 0;
    for (const unsigned char *r = (const unsigned char *)raw; *r && w + 1 < n; r++) {
        if (*r >= 0x80 && *r < 0xc0)
            continue;   /* a UTF-8 continuation byte: its character is one ? already */
        out[w++] = *r >= ' ' && *r <= '~' && *r != '"' && *r != '\\' ? (char)*r : '?';
    }
    out[w] = '\0';
}

/* The file's bytes, NUL-terminated (free them), when it is a regular file of at most
 * TABLE_MAX_BYTES that opens without blocking; else NULL and *why. */
static char *slurp(const char *path, const char **why)
{
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    struct stat st;
    char *buf = NULL;
    if (fd < 0)
        return *why = "it cannot be opened", NULL;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
        *why = "it is not a regular file";
    else if (st.st_size > TABLE_MAX_BYTES)
        *why = "it is larger than a table (1 MiB)";
    else if ((buf = malloc((size_t)st.st_size + 1)) == NULL)
        *why = "out of memory";
    else {
        size_t got = 0;
        ssize_t r;
        while (got < (size_t)st.st_size && (r = read(fd, buf + got, (size_t)st.st_size - got)) > 0)
            got += (size_t)r;
        buf[got] = '\0';
        if (got != (size_t)st.st_size || strlen(buf) != got)
            free(buf), buf = NULL, *why = "it cannot be read whole, or holds a NUL";
    }
    close(fd);
    return buf;
}

/* How many times the table's own field "name" (a key of the outermost object, not of a row)
 * occurs in the JSON text `buf`; the first one's value goes to `out` where it is a plain
 * string ("<no escapes>"), or where `number` is given, a run of digits ending the field (then
 * *number is 1); else `out` is "".  *escaped: some key of the outermost object is written with
 * escapes (the Python library refuses such a table: both read its fields alike). */
static int field(const char *buf, const char *name, char *out, size_t n, int *number, int *escaped)
{
    size_t len = strlen(name);
    int depth = 0, count = 0;
    out[0] = '\0';
    *escaped = 0;
    if (number)
        *number = 0;
    for (const char *p = buf; *p; p++) {
        if (*p == '{' || *p == '[')
            depth++;
        else if (*p == '}' || *p == ']')
            depth--;
        if (*p != '"')
            continue;
        const char *key = ++p;   /* a string: to its closing quote */
        while (*p && *p != '"')
            p += p[0] == '\\' && p[1] ? 2 : 1;
        if (!*p)
            break;
        const char *v = p + 1;
        while (isspace((unsigned char)*v))
            v++;
        if (depth != 1 || *v != ':')   /* a value, or a key of a nested object */
            continue;
        if (memchr(key, '\\', (size_t)(p - key)))
            *escaped = 1;
        if ((size_t)(p - key) != len || memcmp(key, name, len) != 0 || ++count > 1)
            continue;
        v++;
        while (isspace((unsigned char)*v))
            v++;
        if (number && isdigit((unsigned char)*v)) {
            size_t k = strspn(v, "0123456789"), end = k;
            while (isspace((unsigned char)v[end]))
                end++;
            if ((v[end] == ',' || v[end] == '}') && k < n)
                memcpy(out, v, k), out[k] = '\0', *number = 1;
        } else if (*v == '"') {
            size_t k = strcspn(v + 1, "\"\\");
            if (v[1 + k] == '"' && k < n)
                memcpy(out, v + 1, k), out[k] = '\0';
        }
    }
    return count;
}

/* A number field of the table, at most once: 1 and *out where it is one integer from lo to hi
 * (decimal digits, no leading zero), 0 where it is absent, -1 otherwise. */
static int number_field(const char *buf, const char *name, long long lo, long long hi, long long *out)
{
    char value[4096];
    int number, escaped, count = field(buf, name, value, sizeof value, &number, &escaped);
    if (count == 0)
        return 0;
    if (count > 1 || !number || strlen(value) > 18 || (value[0] == '0' && value[1]))
        return -1;
    *out = atoll(value);
    return *out >= lo && *out <= hi ? 1 : -1;
}

/* The path a table's text chose for `line`: TUNE_PATH_CORE or TUNE_PATH_MPI, its node tree's
 * radix (0 where it names none) and its direct allreduce's gate (-1 where it names none); else
 * TUNE_PATH_NONE and *why. */
static int table_path(const char *buf, const char *line, pmpi_tuned *t, const char **why)
{
    char value[4096];
    int escaped;
    long long radix = 0, direct = -1;
    t->radix = 0, t->direct_total = -1;
    field(buf, "format", value, sizeof value, NULL, &escaped);
    if (escaped)
        return *why = "a field of its own is named with escapes", TUNE_PATH_NONE;
    if (number_field(buf, "radix", 2, HM_MAX_RADIX, &radix) < 0)
        return *why = "its radix is not one integer from 2 to 16", TUNE_PATH_NONE;
    if (number_field(buf, "direct_total", 0, HM_DIRECT_TOTAL_MAX, &direct) < 0)
        return *why = "its direct_total is not one integer from 0 to 2^30", TUNE_PATH_NONE;
    t->radix = (int)radix, t->direct_total = (int)direct;
    if (field(buf, "format", value, sizeof value, NULL, &escaped) != 1 || strcmp(value, TABLE_FORMAT) != 0)
        return *why = "it is not a table of format " TABLE_FORMAT " (run hybridmpi tune again)",
               TUNE_PATH_NONE;
    if (field(buf, "key_line", value, sizeof value, NULL, &escaped) != 1 || strcmp(value, line) != 0)
        return *why = "it is for another host, MPI, thread level or layout", TUNE_PATH_NONE;
    if (field(buf, "path", value, sizeof value, NULL, &escaped) != 1 || (strcmp(value, "core") && strcmp(value, "mpi")))
        return *why = "its path is not core or mpi", TUNE_PATH_NONE;
    return strcmp(value, "mpi") == 0 ? TUNE_PATH_MPI : TUNE_PATH_CORE;
}

static int file_path(const char *path, const char *line, pmpi_tuned *t, const char **why)
{
    char *buf = slurp(path, why);
    if (buf == NULL)
        return TUNE_PATH_NONE;
    int got = table_path(buf, line, t, why);
    free(buf);
    return got;
}

/* The value of environment variable `name`, its surrounding whitespace trimmed (as
 * settings.raw), into out; 0 where unset or empty. */
static int env_trimmed(const char *name, char *out, size_t n)
{
    const char *v = getenv(name);
    if (v == NULL)
        return 0;
    while (isspace((unsigned char)*v))
        v++;
    size_t len = strlen(v);
    while (len > 0 && isspace((unsigned char)v[len - 1]))
        len--;
    if (len == 0 || len >= n)
        return 0;
    memcpy(out, v, len);
    out[len] = '\0';
    return 1;
}

/* The cache folder (tuning.settings.tune_dir): HYBRIDMPI_TUNE_DIR, else
 * XDG_CACHE_HOME/hybridmpi/tune, else ~/.cache/hybridmpi/tune; 0 where none is known. */
static int cache_dir(char *out, size_t n)
{
    char v[4096];
    const char *home = getenv("HOME");
    if (env_trimmed("HYBRIDMPI_TUNE_DIR", v, sizeof v))
        return snprintf(out, n, "%s", v) < (int)n;
    if (env_trimmed("XDG_CACHE_HOME", v, sizeof v))
        return snprintf(out, n, "%s/hybridmpi/tune", v) < (int)n;
    if (home == NULL || !*home) {
        struct passwd *pw = getpwuid(getuid());
        home = pw != NULL ? pw->pw_dir : NULL;
    }
    return home != NULL && snprintf(out, n, "%s/.cache/hybridmpi/tune", home) < (int)n;
}

/* The 64-bit FNV-1a hash of a string (tuning.fnv1a64). */
static uint64_t fnv1a64(const char *s)
{
    uint64_t h = 0xcbf29ce484222325ULL;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 0x100000001b3ULL;
    return h;
}

/* The table of the cache folder for `line`: the file that tuning.file_name names. */
static int from_cache(const pmpi_layout *l, const char *line, char *where, size_t n, pmpi_tuned *t)
{
    char dir[4096];
    const char *why;
    if (!cache_dir(dir, sizeof dir) ||
        snprintf(where, n, "%s/%dr-%dn-%016llx.json", dir, l->ranks, l->nodes,
                 (unsigned long long)fnv1a64(line)) >= (int)n)
        return TUNE_PATH_NONE;
    return file_path(where, line, t, &why);
}

int pmpi_tune_table(const pmpi_layout *l, int rank, char *where, size_t n, pmpi_tuned *t)
{
    static int said;   /* a named table that cannot be taken is said once per process */
    char line[4096], named[4096];
    const char *why = NULL;
    t->radix = 0, t->direct_total = -1;
    key_line(l, line, sizeof line);
    if (!env_trimmed("HYBRIDMPI_TUNE_FILE", named, sizeof named))
        return from_cache(l, line, where, n, t);
    snprintf(where, n, "%s", named);
    int got = file_path(named, line, t, &why);
    if (got == TUNE_PATH_NONE && rank == 0 && !said) {
        said = 1;
        fprintf(stderr, "hybridmpi pmpi: the tuning table HYBRIDMPI_TUNE_FILE=%s is not taken: %s; "
                "the layout's default path is taken\n", named, why);
    }
    return got;
}
