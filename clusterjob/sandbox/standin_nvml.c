/*
 * Stand-in libnvidia-ml.so.1 for machines without an NVIDIA GPU.
 *
 * Built against the real nvml.h (PyPI package nvidia-nvml-dev) so the unmodified pynvml
 * bindings load it through LD_LIBRARY_PATH and exercise the real ctypes structures,
 * versioned entry points and error codes. The GPUs it reports come from a scenario file
 * named by $FAKE_NVML_SCENARIO ("%n" in the value is replaced by $SLURMD_NODENAME, so one
 * setting serves every node of a sandbox cluster). The file is read at each first nvmlInit;
 * while NVML stays initialised, a change of the file (its mtime or size) is read again for
 * the usage keys only (utilization, memory_used, power_usage) by the calls that report them,
 * so a test can change a GPU's load during a job as a long-running sampler sees it.
 *
 * Scenario: one "key = value" per line, '#' starts a comment line.
 *   driver_version = 550.54.15           cuda_driver_version = 12040
 *   init_error = driver_not_loaded | library_mismatch | version_mismatch | no_permission | unknown
 *   gpu.N.name / uuid / serial / bus_id (any PCI form) / minor / memory_total / memory_used
 *   gpu.N.ecc_uncorrectable / remapped_pending / remapped_failure / mig_current / mig_pending
 *   gpu.N.persistence / utilization (percent)
 *   gpu.N.pcie_width / pcie_width_max / pcie_gen / pcie_gen_max   PCIe link (16, 16, 4, 4)
 *   gpu.N.temperature / temperature_slowdown   degrees C (35, 90)
 *   gpu.N.clocks_event_reasons = 0x48   nvmlClocksEventReason* bits active now (0)
 *   gpu.N.nvlinks = L            NVLink links 0..L-1 (0: the GPU has none, NOT_SUPPORTED)
 *   gpu.N.nvlinks_down = 3,7     those links are inactive
 *   gpu.N.fabric_state = not_started | in_progress | completed   (unset: NOT_SUPPORTED)
 *   gpu.N.fabric_status = R      nvmlReturn_t of the fabric registration (0: success)
 *   gpu.N.cpu_affinity = 0-31,64-95   CPUs near the GPU (unset: every configured CPU)
 *   gpu.N.power_limit / power_limit_default = 700000   enforced and default limit, mW
 *   gpu.N.power_usage = 60000    power drawn now, mW (nvmlDeviceGetPowerUsage)
 *   gpu.N.retired_pages_pending = 0|1   a page retirement waits for a reset
 *   gpu.N.mig.K = 1g.10gb:MIG-<uuid>   MIG device K (GPU instance K+1, compute instance 0),
 *                                named "<GPU name> MIG 1g.10gb"; listed only with mig_current
 *   gpu.N.lost_after_calls = K   calls addressing GPU N beyond the first K return GPU_IS_LOST
 *                                (handle lookups count; K = 0 loses the GPU outright)
 *   gpu.N.hang_seconds = S       every call addressing GPU N sleeps S seconds first
 *   gpu.N.unsupported = ecc,remap,mig,serial,...   those calls return NOT_SUPPORTED
 *                      (also: name, uuid, minor, pci, memory, persistence, processes,
 *                       utilization, pcie, temperature, clocks, nvlink, fabric, affinity,
 *                       power, retired, events)
 *   gpu.N.process.K = pid:used_bytes:name        running compute processes
 *   gpu.N.xid = 79,48            Xid critical-error events of GPU N, each delivered once to
 *                                every event set registered for them (nvmlEventSetWait_v2)
 * N is the NVML index; GPUs must be numbered 0..count-1 without gaps.
 *
 * A missing $FAKE_NVML_SCENARIO or scenario file behaves like a node without the driver
 * (NVML_ERROR_DRIVER_NOT_LOADED); a malformed file fails nvmlInit with NVML_ERROR_UNKNOWN.
 * Both say why on stderr, prefixed "standin-nvml:".
 */

#define NVML_NO_UNVERSIONED_FUNC_DEFS 1
#include <nvml.h>

#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/stat.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))

#define MAX_GPUS 64
#define MAX_PROCS 32
#define TEXT 128

enum {
    UNSUP_NAME = 1 << 0,
    UNSUP_UUID = 1 << 1,
    UNSUP_SERIAL = 1 << 2,
    UNSUP_MINOR = 1 << 3,
    UNSUP_PCI = 1 << 4,
    UNSUP_MEMORY = 1 << 5,
    UNSUP_ECC = 1 << 6,
    UNSUP_REMAP = 1 << 7,
    UNSUP_MIG = 1 << 8,
    UNSUP_PERSISTENCE = 1 << 9,
    UNSUP_PROCESSES = 1 << 10,
    UNSUP_UTILIZATION = 1 << 11,
    UNSUP_PCIE = 1 << 12,
    UNSUP_TEMPERATURE = 1 << 13,
    UNSUP_CLOCKS = 1 << 14,
    UNSUP_NVLINK = 1 << 15,
    UNSUP_FABRIC = 1 << 16,
    UNSUP_AFFINITY = 1 << 17,
    UNSUP_POWER = 1 << 18,
    UNSUP_RETIRED = 1 << 19,
    UNSUP_EVENTS = 1 << 20,
};

static const struct {
    const char *word;
    unsigned bit;
} unsupported_words[] = {
    {"name", UNSUP_NAME},
    {"uuid", UNSUP_UUID},
    {"serial", UNSUP_SERIAL},
    {"minor", UNSUP_MINOR},
    {"pci", UNSUP_PCI},
    {"memory", UNSUP_MEMORY},
    {"ecc", UNSUP_ECC},
    {"remap", UNSUP_REMAP},
    {"mig", UNSUP_MIG},
    {"persistence", UNSUP_PERSISTENCE},
    {"processes", UNSUP_PROCESSES},
    {"utilization", UNSUP_UTILIZATION},
    {"pcie", UNSUP_PCIE},
    {"temperature", UNSUP_TEMPERATURE},
    {"clocks", UNSUP_CLOCKS},
    {"nvlink", UNSUP_NVLINK},
    {"fabric", UNSUP_FABRIC},
    {"affinity", UNSUP_AFFINITY},
    {"power", UNSUP_POWER},
    {"retired", UNSUP_RETIRED},
    {"events", UNSUP_EVENTS},
};

#define MAX_MIGS 7
#define MAX_XIDS 16
#define MAX_EVENT_SETS 8
#define MAX_CPUS 1024
#define CPU_WORDS (MAX_CPUS / 64)

#define MAX_NVLINKS NVML_NVLINK_MAX_LINKS

struct standin_process {
    unsigned int pid;
    unsigned long long used;
    char name[TEXT];
};

/* nvml.h only forward-declares struct nvmlDevice_st: a handle here is a pointer to this. */
struct nvmlDevice_st {
    int defined;
    char name[TEXT];
    char uuid[TEXT];
    char serial[TEXT];
    unsigned int domain, bus, device, function;
    int has_bus_id;
    unsigned int minor;
    int has_minor;
    unsigned long long memory_total, memory_used;
    unsigned long long ecc_uncorrectable;
    int remapped_pending, remapped_failure;
    int mig_current, mig_pending;
    int persistence;
    unsigned int utilization;
    unsigned int pcie_width, pcie_width_max, pcie_gen, pcie_gen_max;
    unsigned int temperature, temperature_slowdown;
    unsigned long long clocks_event_reasons;
    unsigned int nvlinks;
    unsigned char nvlink_down[MAX_NVLINKS];
    int fabric_state; /* -1: NOT_SUPPORTED; else NVML_GPU_FABRIC_STATE_* */
    unsigned int fabric_status;
    unsigned long long cpu_affinity[CPU_WORDS];
    int has_cpu_affinity;
    unsigned int power_limit, power_limit_default; /* mW */
    unsigned int power_usage;                      /* mW */
    int retired_pages_pending;
    struct nvmlDevice_st *parent; /* a MIG device's GPU; NULL for a GPU */
    unsigned int gpu_instance, compute_instance;
    int nmigs;
    long lost_after_calls; /* -1: never lost */
    double hang_seconds;
    unsigned unsupported;
    struct standin_process procs[MAX_PROCS];
    int nprocs;
    unsigned long long xids[MAX_XIDS];
    int nxids;
    long calls;
};

/* nvml.h only forward-declares struct nvmlEventSet_st too. */
struct nvmlEventSet_st {
    int used;
    unsigned long long registered[MAX_GPUS]; /* event types registered per GPU */
    int delivered[MAX_GPUS];                 /* Xids of that GPU already handed out */
};
static struct nvmlEventSet_st event_sets[MAX_EVENT_SETS];

static struct nvmlDevice_st gpus[MAX_GPUS];
static struct nvmlDevice_st migs[MAX_GPUS][MAX_MIGS];
static unsigned int gpu_count;
static char driver_version[TEXT];
static int cuda_driver_version;
static nvmlReturn_t init_error;
static int refcount;

static void say(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("standin-nvml: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

static char *trim(char *s)
{
    while (isspace((unsigned char)*s))
        s++;
    char *end = s + strlen(s);
    while (end > s && isspace((unsigned char)end[-1]))
        *--end = '\0';
    return s;
}

static int copy_text(char *dst, const char *src)
{
    if (strlen(src) >= TEXT)
        return -1;
    strcpy(dst, src);
    return 0;
}

static int parse_ull(const char *s, unsigned long long *out)
{
    char *end;
    if (!*s || *s == '-')
        return -1;
    errno = 0;
    *out = strtoull(s, &end, 0);
    return (errno || *end) ? -1 : 0;
}

static int parse_bool(const char *s, int *out)
{
    if (!strcmp(s, "1") || !strcasecmp(s, "true") || !strcasecmp(s, "yes")) {
        *out = 1;
        return 0;
    }
    if (!strcmp(s, "0") || !strcasecmp(s, "false") || !strcasecmp(s, "no")) {
        *out = 0;
        return 0;
    }
    return -1;
}

/* Accepts "00000000:07:00.0", "0000:07:00.0" and "07:00.0", any case. */
static int parse_bus_id(const char *s, unsigned *domain, unsigned *bus, unsigned *device,
                        unsigned *function)
{
    char tail;
    if (sscanf(s, "%x:%x:%x.%x%c", domain, bus, device, function, &tail) == 4)
        return 0;
    *domain = 0;
    if (sscanf(s, "%x:%x.%x%c", bus, device, function, &tail) == 3)
        return 0;
    return -1;
}

static int parse_unsupported(const char *value, unsigned *out)
{
    char buf[512];
    if (strlen(value) >= sizeof buf)
        return -1;
    strcpy(buf, value);
    *out = 0;
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok;
         tok = strtok_r(NULL, ",", &save)) {
        char *word = trim(tok);
        size_t i;
        if (!*word)
            continue;
        for (i = 0; i < sizeof unsupported_words / sizeof unsupported_words[0]; i++)
            if (!strcmp(word, unsupported_words[i].word))
                break;
        if (i == sizeof unsupported_words / sizeof unsupported_words[0])
            return -1;
        *out |= unsupported_words[i].bit;
    }
    return 0;
}

static int parse_uint(const char *s, unsigned int max, unsigned int *out)
{
    unsigned long long n;
    if (parse_ull(s, &n) || n > max)
        return -1;
    *out = (unsigned int)n;
    return 0;
}

static int parse_links(const char *value, unsigned char *down)
{
    char buf[512];
    if (strlen(value) >= sizeof buf)
        return -1;
    strcpy(buf, value);
    memset(down, 0, MAX_NVLINKS);
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok;
         tok = strtok_r(NULL, ",", &save)) {
        unsigned int link;
        char *word = trim(tok);
        if (!*word)
            continue;
        if (parse_uint(word, MAX_NVLINKS - 1, &link))
            return -1;
        down[link] = 1;
    }
    return 0;
}

/* A Linux CPU list, "0-31,64-95", into a bit mask. */
static int parse_cpu_list(const char *value, unsigned long long *mask)
{
    char buf[1024];
    if (strlen(value) >= sizeof buf)
        return -1;
    strcpy(buf, value);
    memset(mask, 0, CPU_WORDS * sizeof *mask);
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok;
         tok = strtok_r(NULL, ",", &save)) {
        unsigned int first, last;
        char *word = trim(tok), *dash = strchr(word, '-');
        if (dash)
            *dash = '\0';
        if (parse_uint(trim(word), MAX_CPUS - 1, &first))
            return -1;
        last = first;
        if (dash && parse_uint(trim(dash + 1), MAX_CPUS - 1, &last))
            return -1;
        if (last < first)
            return -1;
        for (unsigned int c = first; c <= last; c++)
            mask[c / 64] |= 1ULL << (c % 64);
    }
    return 0;
}

static int parse_process(const char *value, struct standin_process *p)
{
    char buf[TEXT * 2];
    if (strlen(value) >= sizeof buf)
        return -1;
    strcpy(buf, value);
    char *first = strchr(buf, ':');
    if (!first)
        return -1;
    char *second = strchr(first + 1, ':');
    if (!second)
        return -1;
    *first = *second = '\0';
    unsigned long long pid;
    if (parse_ull(trim(buf), &pid) || pid == 0 || pid > 0xFFFFFFFFULL)
        return -1;
    p->pid = (unsigned int)pid;
    if (parse_ull(trim(first + 1), &p->used))
        return -1;
    return copy_text(p->name, trim(second + 1));
}

/* One "gpu.N.field = value" line; returns an error text or NULL. */
static const char *set_gpu_field(struct nvmlDevice_st *g, const char *field, const char *value)
{
    unsigned long long n;
    if (!strcmp(field, "name"))
        return copy_text(g->name, value) ? "name too long" : NULL;
    if (!strcmp(field, "uuid"))
        return copy_text(g->uuid, value) ? "uuid too long" : NULL;
    if (!strcmp(field, "serial"))
        return copy_text(g->serial, value) ? "serial too long" : NULL;
    if (!strcmp(field, "bus_id")) {
        if (parse_bus_id(value, &g->domain, &g->bus, &g->device, &g->function))
            return "bus_id is not a PCI address";
        g->has_bus_id = 1;
        return NULL;
    }
    if (!strcmp(field, "minor")) {
        if (parse_ull(value, &n) || n > 0xFFFFFFFFULL)
            return "minor is not a number";
        g->minor = (unsigned int)n;
        g->has_minor = 1;
        return NULL;
    }
    if (!strcmp(field, "memory_total"))
        return parse_ull(value, &g->memory_total) ? "memory_total is not a number" : NULL;
    if (!strcmp(field, "memory_used"))
        return parse_ull(value, &g->memory_used) ? "memory_used is not a number" : NULL;
    if (!strcmp(field, "ecc_uncorrectable"))
        return parse_ull(value, &g->ecc_uncorrectable) ? "ecc_uncorrectable is not a number"
                                                       : NULL;
    if (!strcmp(field, "remapped_pending"))
        return parse_bool(value, &g->remapped_pending) ? "remapped_pending is not a bool" : NULL;
    if (!strcmp(field, "remapped_failure"))
        return parse_bool(value, &g->remapped_failure) ? "remapped_failure is not a bool" : NULL;
    if (!strcmp(field, "mig_current"))
        return parse_bool(value, &g->mig_current) ? "mig_current is not a bool" : NULL;
    if (!strcmp(field, "mig_pending"))
        return parse_bool(value, &g->mig_pending) ? "mig_pending is not a bool" : NULL;
    if (!strcmp(field, "persistence"))
        return parse_bool(value, &g->persistence) ? "persistence is not a bool" : NULL;
    if (!strcmp(field, "utilization")) {
        if (parse_ull(value, &n) || n > 100)
            return "utilization is not a percentage";
        g->utilization = (unsigned int)n;
        return NULL;
    }
    if (!strcmp(field, "pcie_width"))
        return parse_uint(value, 32, &g->pcie_width) ? "pcie_width is not a lane count" : NULL;
    if (!strcmp(field, "pcie_width_max"))
        return parse_uint(value, 32, &g->pcie_width_max) ? "pcie_width_max is not a lane count"
                                                          : NULL;
    if (!strcmp(field, "pcie_gen"))
        return parse_uint(value, 9, &g->pcie_gen) ? "pcie_gen is not a PCIe generation" : NULL;
    if (!strcmp(field, "pcie_gen_max"))
        return parse_uint(value, 9, &g->pcie_gen_max) ? "pcie_gen_max is not a PCIe generation"
                                                      : NULL;
    if (!strcmp(field, "temperature"))
        return parse_uint(value, 200, &g->temperature) ? "temperature is not degrees C" : NULL;
    if (!strcmp(field, "temperature_slowdown"))
        return parse_uint(value, 200, &g->temperature_slowdown)
                   ? "temperature_slowdown is not degrees C"
                   : NULL;
    if (!strcmp(field, "clocks_event_reasons"))
        return parse_ull(value, &g->clocks_event_reasons) ? "clocks_event_reasons is not a number"
                                                          : NULL;
    if (!strcmp(field, "nvlinks"))
        return parse_uint(value, MAX_NVLINKS, &g->nvlinks) ? "nvlinks is not a link count" : NULL;
    if (!strcmp(field, "nvlinks_down"))
        return parse_links(value, g->nvlink_down) ? "nvlinks_down is not a list of links" : NULL;
    if (!strcmp(field, "fabric_state")) {
        if (!strcmp(value, "not_started"))
            g->fabric_state = NVML_GPU_FABRIC_STATE_NOT_STARTED;
        else if (!strcmp(value, "in_progress"))
            g->fabric_state = NVML_GPU_FABRIC_STATE_IN_PROGRESS;
        else if (!strcmp(value, "completed"))
            g->fabric_state = NVML_GPU_FABRIC_STATE_COMPLETED;
        else
            return "fabric_state is not not_started, in_progress or completed";
        return NULL;
    }
    if (!strcmp(field, "fabric_status"))
        return parse_uint(value, 1000000, &g->fabric_status) ? "fabric_status is not a number"
                                                             : NULL;
    if (!strcmp(field, "power_limit"))
        return parse_uint(value, 100000000, &g->power_limit) ? "power_limit is not mW" : NULL;
    if (!strcmp(field, "power_limit_default"))
        return parse_uint(value, 100000000, &g->power_limit_default)
                   ? "power_limit_default is not mW"
                   : NULL;
    if (!strcmp(field, "power_usage"))
        return parse_uint(value, 100000000, &g->power_usage) ? "power_usage is not mW" : NULL;
    if (!strcmp(field, "retired_pages_pending"))
        return parse_bool(value, &g->retired_pages_pending) ? "retired_pages_pending is not a bool"
                                                            : NULL;
    if (!strcmp(field, "cpu_affinity")) {
        if (parse_cpu_list(value, g->cpu_affinity))
            return "cpu_affinity is not a CPU list such as 0-31,64-95";
        g->has_cpu_affinity = 1;
        return NULL;
    }
    if (!strncmp(field, "mig.", 4)) {
        char *end, buf[TEXT * 2];
        long k = strtol(field + 4, &end, 10);
        if (*end || end == field + 4 || k < 0 || k >= MAX_MIGS)
            return "bad MIG device number (0..6)";
        if (strlen(value) >= sizeof buf)
            return "MIG device too long";
        strcpy(buf, value);
        char *colon = strchr(buf, ':');
        if (!colon)
            return "MIG device must be profile:MIG-uuid";
        *colon = '\0';
        struct nvmlDevice_st *m = &migs[g - gpus][k];
        if (copy_text(m->name, trim(buf)) || copy_text(m->uuid, trim(colon + 1)))
            return "MIG device too long";
        m->defined = 1;
        m->parent = g;
        m->gpu_instance = (unsigned int)k + 1;
        m->memory_total = strtoull(strchr(m->name, '.') ? strchr(m->name, '.') + 1 : "0", NULL,
                                   10) << 30; /* "1g.10gb": 10 GiB */
        if (k + 1 > g->nmigs)
            g->nmigs = (int)k + 1;
        return NULL;
    }
    if (!strcmp(field, "lost_after_calls")) {
        if (parse_ull(value, &n) || n > 1000000000ULL)
            return "lost_after_calls is not a number";
        g->lost_after_calls = (long)n;
        return NULL;
    }
    if (!strcmp(field, "hang_seconds")) {
        char *end;
        g->hang_seconds = strtod(value, &end);
        return (*end || g->hang_seconds < 0) ? "hang_seconds is not a number" : NULL;
    }
    if (!strcmp(field, "xid")) {
        char list[TEXT * 2], *save = NULL;
        if (strlen(value) >= sizeof list)
            return "xid list too long";
        strcpy(list, value);
        g->nxids = 0;
        for (char *w = strtok_r(list, ",", &save); w; w = strtok_r(NULL, ",", &save)) {
            if (g->nxids == MAX_XIDS || parse_ull(trim(w), &n) || n > 100000ULL)
                return "xid must be up to 16 Xid numbers, comma-separated";
            g->xids[g->nxids++] = n;
        }
        return NULL;
    }
    if (!strcmp(field, "unsupported"))
        return parse_unsupported(value, &g->unsupported) ? "unknown word in unsupported" : NULL;
    if (!strncmp(field, "process.", 8)) {
        char *end;
        long k = strtol(field + 8, &end, 10);
        if (*end || end == field + 8 || k < 0 || k >= MAX_PROCS)
            return "bad process number";
        if (parse_process(value, &g->procs[k]))
            return "process must be pid:used_bytes:name";
        if (k + 1 > g->nprocs)
            g->nprocs = (int)k + 1;
        return NULL;
    }
    return "unknown key";
}

static const char *set_key(const char *key, const char *value)
{
    if (!strcmp(key, "driver_version"))
        return copy_text(driver_version, value) ? "driver_version too long" : NULL;
    if (!strcmp(key, "cuda_driver_version")) {
        unsigned long long n;
        if (parse_ull(value, &n) || n > 1000000)
            return "cuda_driver_version is not a number such as 12040";
        cuda_driver_version = (int)n;
        return NULL;
    }
    if (!strcmp(key, "init_error")) {
        if (!strcmp(value, "driver_not_loaded"))
            init_error = NVML_ERROR_DRIVER_NOT_LOADED;
        else if (!strcmp(value, "library_mismatch") || !strcmp(value, "version_mismatch"))
            init_error = NVML_ERROR_LIB_RM_VERSION_MISMATCH;
        else if (!strcmp(value, "no_permission"))
            init_error = NVML_ERROR_NO_PERMISSION;
        else if (!strcmp(value, "unknown"))
            init_error = NVML_ERROR_UNKNOWN;
        else if (strcmp(value, "none") && *value)
            return "unknown init_error";
        return NULL;
    }
    if (!strncmp(key, "gpu.", 4)) {
        char *end;
        long n = strtol(key + 4, &end, 10);
        if (end == key + 4 || *end != '.' || n < 0 || n >= MAX_GPUS)
            return "bad GPU number";
        gpus[n].defined = 1;
        if ((unsigned)n + 1 > gpu_count)
            gpu_count = (unsigned)n + 1;
        return set_gpu_field(&gpus[n], end + 1, value);
    }
    return "unknown key";
}

static void reset_scenario(void)
{
    memset(gpus, 0, sizeof gpus);
    memset(migs, 0, sizeof migs);
    memset(event_sets, 0, sizeof event_sets);
    for (int i = 0; i < MAX_GPUS; i++) {
        gpus[i].lost_after_calls = -1;
        gpus[i].persistence = 1;
        gpus[i].pcie_width = gpus[i].pcie_width_max = 16;
        gpus[i].pcie_gen = gpus[i].pcie_gen_max = 4;
        gpus[i].temperature = 35;
        gpus[i].temperature_slowdown = 90;
        gpus[i].fabric_state = -1;
        gpus[i].power_limit = gpus[i].power_limit_default = 700000;
        gpus[i].power_usage = 60000;
    }
    gpu_count = 0;
    strcpy(driver_version, "550.54.15");
    cuda_driver_version = 12040;
    init_error = NVML_SUCCESS;
}

/* The scenario file read at nvmlInit, and its mtime and size then (see refresh_usage). */
struct stamp {
    struct timespec mtime;
    off_t size;
};
static char loaded_path[4096];
static struct stamp loaded_stamp;

static int file_stamp(const char *path, struct stamp *out)
{
    struct stat st;
    if (stat(path, &st))
        return -1;
    out->mtime = st.st_mtim;
    out->size = st.st_size;
    return 0;
}

/* The usage keys of a scenario file changed while NVML is initialised: read those again.
 * A line that does not parse (the file caught half written) is skipped; the next call, after
 * the writer's last change, reads it whole. */
static void refresh_usage(void)
{
    struct stamp now;
    if (!loaded_path[0] || file_stamp(loaded_path, &now))
        return;
    if (now.mtime.tv_sec == loaded_stamp.mtime.tv_sec &&
        now.mtime.tv_nsec == loaded_stamp.mtime.tv_nsec && now.size == loaded_stamp.size)
        return;
    loaded_stamp = now;
    FILE *f = fopen(loaded_path, "r");
    if (!f)
        return;
    char line[1024];
    while (fgets(line, sizeof line, f)) {
        char *s = trim(line), *eq = strchr(s, '='), *end;
        if (strncmp(s, "gpu.", 4) || !eq)
            continue;
        *eq = '\0';
        long n = strtol(s + 4, &end, 10);
        if (end == s + 4 || *end != '.' || n < 0 || (unsigned long)n >= gpu_count)
            continue;
        const char *field = trim(end + 1);
        if (strcmp(field, "utilization") && strcmp(field, "memory_used") &&
            strcmp(field, "power_usage"))
            continue;
        set_gpu_field(&gpus[n], field, trim(eq + 1));
    }
    fclose(f);
}

/* "%n" -> $SLURMD_NODENAME. Returns 0, or -1 with a message printed. */
static int scenario_path(const char *pattern, char *out, size_t size)
{
    const char *node = getenv("SLURMD_NODENAME");
    size_t used = 0;
    for (const char *p = pattern; *p; p++) {
        const char *piece = p;
        size_t len = 1;
        if (p[0] == '%' && p[1] == 'n') {
            if (!node || !*node) {
                say("FAKE_NVML_SCENARIO=%s uses %%n but SLURMD_NODENAME is not set", pattern);
                return -1;
            }
            piece = node;
            len = strlen(node);
            p++;
        }
        if (used + len + 1 > size) {
            say("scenario path too long: %s", pattern);
            return -1;
        }
        memcpy(out + used, piece, len);
        used += len;
    }
    out[used] = '\0';
    return 0;
}

static nvmlReturn_t load_scenario(void)
{
    reset_scenario();
    const char *pattern = getenv("FAKE_NVML_SCENARIO");
    if (!pattern || !*pattern) {
        say("FAKE_NVML_SCENARIO is not set: behaving as a node without the NVIDIA driver");
        return NVML_ERROR_DRIVER_NOT_LOADED;
    }
    char path[4096];
    if (scenario_path(pattern, path, sizeof path))
        return NVML_ERROR_UNKNOWN;
    FILE *f = fopen(path, "r");
    if (!f) {
        say("cannot read scenario %s (%s): behaving as a node without the NVIDIA driver", path,
            strerror(errno));
        return NVML_ERROR_DRIVER_NOT_LOADED;
    }
    strcpy(loaded_path, path);
    file_stamp(path, &loaded_stamp);
    char line[1024];
    int lineno = 0;
    nvmlReturn_t ret = NVML_SUCCESS;
    while (fgets(line, sizeof line, f)) {
        lineno++;
        char *s = trim(line);
        if (!*s || *s == '#')
            continue;
        char *eq = strchr(s, '=');
        if (!eq) {
            say("%s:%d: expected key = value", path, lineno);
            ret = NVML_ERROR_UNKNOWN;
            break;
        }
        *eq = '\0';
        const char *err = set_key(trim(s), trim(eq + 1));
        if (err) {
            say("%s:%d: %s: %s", path, lineno, trim(s), err);
            ret = NVML_ERROR_UNKNOWN;
            break;
        }
    }
    fclose(f);
    for (unsigned i = 0; ret == NVML_SUCCESS && i < gpu_count; i++) {
        if (!gpus[i].defined || !gpus[i].has_bus_id || !gpus[i].name[0] || !gpus[i].uuid[0]) {
            say("%s: gpu.%u needs at least name, uuid and bus_id (GPUs are numbered 0..N-1)",
                path, i);
            ret = NVML_ERROR_UNKNOWN;
        }
        for (int k = 0; ret == NVML_SUCCESS && k < gpus[i].nmigs; k++) {
            struct nvmlDevice_st *m = &migs[i][k];
            char full[TEXT * 2];
            if (!m->defined) {
                say("%s: gpu.%u.mig.%d missing (MIG devices are numbered 0..K-1)", path, i, k);
                ret = NVML_ERROR_UNKNOWN;
                break;
            }
            snprintf(full, sizeof full, "%s MIG %s", gpus[i].name, m->name);
            if (copy_text(m->name, full)) {
                say("%s: gpu.%u.mig.%d: name too long", path, i, k);
                ret = NVML_ERROR_UNKNOWN;
            }
        }
        for (int k = 0; ret == NVML_SUCCESS && k < gpus[i].nprocs; k++)
            if (!gpus[i].procs[k].pid) {
                say("%s: gpu.%u.process.%d missing (processes are numbered 0..K-1)", path, i, k);
                ret = NVML_ERROR_UNKNOWN;
            }
    }
    return ret;
}

/* Every call that addresses one GPU goes through here: validity, hang, loss, support. */
static nvmlReturn_t touch(nvmlDevice_t dev, unsigned unsupported_bit)
{
    if (!refcount)
        return NVML_ERROR_UNINITIALIZED;
    if (dev && dev >= &migs[0][0] && dev < &migs[0][0] + MAX_GPUS * MAX_MIGS) {
        nvmlReturn_t ret; /* a MIG device: its GPU answers for hangs, loss and support */
        if (!dev->defined || !dev->parent->mig_current)
            return NVML_ERROR_INVALID_ARGUMENT;
        ret = touch(dev->parent, 0);
        if (ret == NVML_SUCCESS && (dev->parent->unsupported & unsupported_bit))
            ret = NVML_ERROR_NOT_SUPPORTED;
        return ret;
    }
    if (!dev || dev < gpus || dev >= gpus + gpu_count)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (dev->hang_seconds > 0) {
        struct timespec ts;
        ts.tv_sec = (time_t)dev->hang_seconds;
        ts.tv_nsec = (long)((dev->hang_seconds - (double)ts.tv_sec) * 1e9);
        while (nanosleep(&ts, &ts) && errno == EINTR)
            ;
    }
    dev->calls++;
    if (dev->lost_after_calls >= 0 && dev->calls > dev->lost_after_calls)
        return NVML_ERROR_GPU_IS_LOST;
    if (dev->unsupported & unsupported_bit)
        return NVML_ERROR_NOT_SUPPORTED;
    return NVML_SUCCESS;
}

static nvmlReturn_t put_text(char *buf, unsigned int length, const char *text)
{
    if (!buf)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(text) + 1 > length)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    strcpy(buf, text);
    return NVML_SUCCESS;
}

static nvmlReturn_t hand_out(nvmlDevice_t dev, nvmlDevice_t *out)
{
    nvmlReturn_t ret = touch(dev, 0);
    if (ret == NVML_SUCCESS)
        *out = dev;
    return ret;
}

/* ---- initialisation ------------------------------------------------------------------ */

EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags)
{
    (void)flags;
    if (refcount) {
        refcount++;
        return NVML_SUCCESS;
    }
    nvmlReturn_t ret = load_scenario();
    if (ret == NVML_SUCCESS)
        ret = init_error;
    if (ret == NVML_SUCCESS)
        refcount = 1;
    return ret;
}

EXPORT nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
EXPORT nvmlReturn_t nvmlInit(void) { return nvmlInitWithFlags(0); }

EXPORT nvmlReturn_t nvmlShutdown(void)
{
    if (!refcount)
        return NVML_ERROR_UNINITIALIZED;
    refcount--;
    return NVML_SUCCESS;
}

EXPORT const char *nvmlErrorString(nvmlReturn_t result)
{
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
    case NVML_ERROR_ALREADY_INITIALIZED: return "Already Initialized";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case NVML_ERROR_LIB_RM_VERSION_MISMATCH:
        return "RM has detected an NVML/RM version mismatch.";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument version mismatch";
    default: return "Unknown Error";
    }
}

/* ---- system -------------------------------------------------------------------------- */

EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length)
{
    if (!refcount)
        return NVML_ERROR_UNINITIALIZED;
    return put_text(version, length, driver_version);
}

EXPORT nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length)
{
    char text[TEXT + 16];
    if (!refcount)
        return NVML_ERROR_UNINITIALIZED;
    snprintf(text, sizeof text, "%d.%s", cuda_driver_version / 1000, driver_version);
    return put_text(version, length, text);
}

EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *cudaDriverVersion)
{
    if (!refcount)
        return NVML_ERROR_UNINITIALIZED;
    if (!cudaDriverVersion)
        return NVML_ERROR_INVALID_ARGUMENT;
    *cudaDriverVersion = cuda_driver_version;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *cudaDriverVersion)
{
    return nvmlSystemGetCudaDriverVersion(cudaDriverVersion);
}

EXPORT nvmlReturn_t nvmlSystemGetProcessName(unsigned int pid, char *name, unsigned int length)
{
    if (!refcount)
        return NVML_ERROR_UNINITIALIZED;
    for (unsigned i = 0; i < gpu_count; i++)
        for (int k = 0; k < gpus[i].nprocs; k++)
            if (gpus[i].procs[k].pid == pid)
                return put_text(name, length, gpus[i].procs[k].name);
    return NVML_ERROR_NOT_FOUND;
}

/* ---- finding devices ----------------------------------------------------------------- */

EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *deviceCount)
{
    if (!refcount)
        return NVML_ERROR_UNINITIALIZED;
    if (!deviceCount)
        return NVML_ERROR_INVALID_ARGUMENT;
    *deviceCount = gpu_count;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetCount(unsigned int *deviceCount)
{
    return nvmlDeviceGetCount_v2(deviceCount);
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device)
{
    if (!refcount)
        return NVML_ERROR_UNINITIALIZED;
    if (!device || index >= gpu_count)
        return NVML_ERROR_INVALID_ARGUMENT;
    return hand_out(&gpus[index], device);
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device)
{
    return nvmlDeviceGetHandleByIndex_v2(index, device);
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device)
{
    if (!refcount)
        return NVML_ERROR_UNINITIALIZED;
    if (!uuid || !device)
        return NVML_ERROR_INVALID_ARGUMENT;
    for (unsigned i = 0; i < gpu_count; i++)
        if (!strcmp(gpus[i].uuid, uuid))
            return hand_out(&gpus[i], device);
    return NVML_ERROR_NOT_FOUND;
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleBySerial(const char *serial, nvmlDevice_t *device)
{
    if (!refcount)
        return NVML_ERROR_UNINITIALIZED;
    if (!serial || !device)
        return NVML_ERROR_INVALID_ARGUMENT;
    for (unsigned i = 0; i < gpu_count; i++)
        if (gpus[i].serial[0] && !strcmp(gpus[i].serial, serial))
            return hand_out(&gpus[i], device);
    return NVML_ERROR_NOT_FOUND;
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *pciBusId, nvmlDevice_t *device)
{
    unsigned domain, bus, dev, function;
    if (!refcount)
        return NVML_ERROR_UNINITIALIZED;
    if (!pciBusId || !device || parse_bus_id(pciBusId, &domain, &bus, &dev, &function))
        return NVML_ERROR_INVALID_ARGUMENT;
    for (unsigned i = 0; i < gpu_count; i++) {
        struct nvmlDevice_st *g = &gpus[i];
        if (g->domain == domain && g->bus == bus && g->device == dev && g->function == function)
            return hand_out(g, device);
    }
    return NVML_ERROR_NOT_FOUND;
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByPciBusId(const char *pciBusId, nvmlDevice_t *device)
{
    return nvmlDeviceGetHandleByPciBusId_v2(pciBusId, device);
}

/* ---- identity ------------------------------------------------------------------------ */

EXPORT nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index)
{
    nvmlReturn_t ret = touch(device, 0);
    if (ret != NVML_SUCCESS)
        return ret;
    if (!index)
        return NVML_ERROR_INVALID_ARGUMENT;
    *index = (unsigned int)(device - gpus);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length)
{
    nvmlReturn_t ret = touch(device, UNSUP_NAME);
    return ret != NVML_SUCCESS ? ret : put_text(name, length, device->name);
}

EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length)
{
    nvmlReturn_t ret = touch(device, UNSUP_UUID);
    return ret != NVML_SUCCESS ? ret : put_text(uuid, length, device->uuid);
}

EXPORT nvmlReturn_t nvmlDeviceGetSerial(nvmlDevice_t device, char *serial, unsigned int length)
{
    nvmlReturn_t ret = touch(device, UNSUP_SERIAL);
    if (ret == NVML_SUCCESS && !device->serial[0])
        ret = NVML_ERROR_NOT_SUPPORTED; /* consumer boards have no serial */
    return ret != NVML_SUCCESS ? ret : put_text(serial, length, device->serial);
}

EXPORT nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned int *minorNumber)
{
    nvmlReturn_t ret = touch(device, UNSUP_MINOR);
    if (ret != NVML_SUCCESS)
        return ret;
    if (!minorNumber)
        return NVML_ERROR_INVALID_ARGUMENT;
    *minorNumber = device->has_minor ? device->minor : (unsigned int)(device - gpus);
    return NVML_SUCCESS;
}

static nvmlReturn_t fill_pci(nvmlDevice_t device, nvmlPciInfo_t *pci)
{
    nvmlReturn_t ret = touch(device, UNSUP_PCI);
    if (ret != NVML_SUCCESS)
        return ret;
    if (!pci)
        return NVML_ERROR_INVALID_ARGUMENT;
    memset(pci, 0, sizeof *pci);
    pci->domain = device->domain;
    pci->bus = device->bus;
    pci->device = device->device;
    pci->pciDeviceId = 0x20B210DE; /* device id << 16 | NVIDIA's vendor id */
    pci->pciSubSystemId = 0x147F10DE;
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%04X:%02X:%02X.%X",
             device->domain & 0xFFFF, device->bus, device->device, device->function);
    snprintf(pci->busId, sizeof pci->busId, "%08X:%02X:%02X.%X", device->domain, device->bus,
             device->device, device->function);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci)
{
    return fill_pci(device, pci);
}

EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v2(nvmlDevice_t device, nvmlPciInfo_t *pci)
{
    return fill_pci(device, pci);
}

EXPORT nvmlReturn_t nvmlDeviceGetPciInfo(nvmlDevice_t device, nvmlPciInfo_t *pci)
{
    return fill_pci(device, pci);
}

EXPORT nvmlReturn_t nvmlDeviceGetPciInfoExt(nvmlDevice_t device, nvmlPciInfoExt_t *pci)
{
    nvmlPciInfo_t base;
    nvmlReturn_t ret;
    if (pci && pci->version != nvmlPciInfoExt_v1)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    ret = fill_pci(device, &base);
    if (ret != NVML_SUCCESS)
        return ret;
    pci->domain = base.domain;
    pci->bus = base.bus;
    pci->device = base.device;
    pci->pciDeviceId = base.pciDeviceId;
    pci->pciSubSystemId = base.pciSubSystemId;
    pci->baseClass = 0x03; /* display controller */
    pci->subClass = 0x02;  /* 3D controller */
    memcpy(pci->busId, base.busId, sizeof pci->busId);
    return NVML_SUCCESS;
}

/* ---- state --------------------------------------------------------------------------- */

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)
{
    nvmlReturn_t ret = touch(device, UNSUP_MEMORY);
    if (ret != NVML_SUCCESS)
        return ret;
    if (!memory)
        return NVML_ERROR_INVALID_ARGUMENT;
    refresh_usage();
    memory->total = device->memory_total;
    memory->used = device->memory_used;
    memory->free = device->memory_total > device->memory_used
                       ? device->memory_total - device->memory_used
                       : 0;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory)
{
    nvmlMemory_t v1;
    nvmlReturn_t ret;
    if (memory && memory->version != nvmlMemory_v2)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    ret = nvmlDeviceGetMemoryInfo(device, &v1);
    if (ret != NVML_SUCCESS)
        return ret;
    if (!memory)
        return NVML_ERROR_INVALID_ARGUMENT;
    memory->total = v1.total;
    memory->reserved = 0;
    memory->free = v1.free;
    memory->used = v1.used;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t device,
                                                nvmlMemoryErrorType_t errorType,
                                                nvmlEccCounterType_t counterType,
                                                unsigned long long *eccCounts)
{
    nvmlReturn_t ret = touch(device, UNSUP_ECC);
    if (ret != NVML_SUCCESS)
        return ret;
    if (!eccCounts || (counterType != NVML_VOLATILE_ECC && counterType != NVML_AGGREGATE_ECC))
        return NVML_ERROR_INVALID_ARGUMENT;
    if (errorType == NVML_MEMORY_ERROR_TYPE_UNCORRECTED)
        *eccCounts = device->ecc_uncorrectable;
    else if (errorType == NVML_MEMORY_ERROR_TYPE_CORRECTED)
        *eccCounts = 0;
    else
        return NVML_ERROR_INVALID_ARGUMENT;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetRemappedRows(nvmlDevice_t device, unsigned int *corrRows,
                                              unsigned int *uncRows, unsigned int *isPending,
                                              unsigned int *failureOccurred)
{
    nvmlReturn_t ret = touch(device, UNSUP_REMAP);
    if (ret != NVML_SUCCESS)
        return ret;
    if (!corrRows || !uncRows || !isPending || !failureOccurred)
        return NVML_ERROR_INVALID_ARGUMENT;
    *corrRows = 0;
    *uncRows = (device->remapped_pending || device->remapped_failure) ? 1 : 0;
    *isPending = device->remapped_pending ? 1 : 0;
    *failureOccurred = device->remapped_failure ? 1 : 0;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *currentMode,
                                         unsigned int *pendingMode)
{
    nvmlReturn_t ret = touch(device, UNSUP_MIG);
    if (ret != NVML_SUCCESS)
        return ret;
    if (!currentMode || !pendingMode)
        return NVML_ERROR_INVALID_ARGUMENT;
    *currentMode = device->mig_current ? NVML_DEVICE_MIG_ENABLE : NVML_DEVICE_MIG_DISABLE;
    *pendingMode = device->mig_pending ? NVML_DEVICE_MIG_ENABLE : NVML_DEVICE_MIG_DISABLE;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetPersistenceMode(nvmlDevice_t device, nvmlEnableState_t *mode)
{
    nvmlReturn_t ret = touch(device, UNSUP_PERSISTENCE);
    if (ret != NVML_SUCCESS)
        return ret;
    if (!mode)
        return NVML_ERROR_INVALID_ARGUMENT;
    *mode = device->persistence ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device,
                                                  nvmlUtilization_t *utilization)
{
    nvmlReturn_t ret = touch(device, UNSUP_UTILIZATION);
    if (ret != NVML_SUCCESS)
        return ret;
    if (!utilization)
        return NVML_ERROR_INVALID_ARGUMENT;
    refresh_usage();
    utilization->gpu = device->utilization;
    utilization->memory = device->utilization / 2;
    return NVML_SUCCESS;
}

/* NVML's two-call protocol: ask with too small a buffer, learn the count, ask again. */
static nvmlReturn_t list_processes(nvmlDevice_t device, unsigned int *infoCount,
                                   nvmlProcessInfo_t *infos, nvmlProcessInfo_v1_t *infos_v1)
{
    nvmlReturn_t ret = touch(device, UNSUP_PROCESSES);
    if (ret != NVML_SUCCESS)
        return ret;
    if (!infoCount)
        return NVML_ERROR_INVALID_ARGUMENT;
    unsigned int n = (unsigned int)device->nprocs;
    if (*infoCount < n || (n && !infos && !infos_v1)) {
        *infoCount = n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (unsigned int k = 0; k < n; k++) {
        if (infos) {
            infos[k].pid = device->procs[k].pid;
            infos[k].usedGpuMemory = device->procs[k].used;
            infos[k].gpuInstanceId = 0xFFFFFFFF;
            infos[k].computeInstanceId = 0xFFFFFFFF;
        } else {
            infos_v1[k].pid = device->procs[k].pid;
            infos_v1[k].usedGpuMemory = device->procs[k].used;
        }
    }
    *infoCount = n;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device,
                                                            unsigned int *infoCount,
                                                            nvmlProcessInfo_t *infos)
{
    return list_processes(device, infoCount, infos, NULL);
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t device,
                                                            unsigned int *infoCount,
                                                            nvmlProcessInfo_v2_t *infos)
{
    return list_processes(device, infoCount, infos, NULL);
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t device,
                                                         unsigned int *infoCount,
                                                         nvmlProcessInfo_v1_t *infos)
{
    return list_processes(device, infoCount, NULL, infos);
}

/* ---- links, clocks, temperature ------------------------------------------------------ */

static nvmlReturn_t put_uint(nvmlDevice_t device, unsigned bit, unsigned int *out,
                             unsigned int value)
{
    nvmlReturn_t ret = touch(device, bit);
    if (ret != NVML_SUCCESS)
        return ret;
    if (!out)
        return NVML_ERROR_INVALID_ARGUMENT;
    *out = value;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetCurrPcieLinkWidth(nvmlDevice_t device, unsigned int *width)
{
    return put_uint(device, UNSUP_PCIE, width, device ? device->pcie_width : 0);
}

EXPORT nvmlReturn_t nvmlDeviceGetMaxPcieLinkWidth(nvmlDevice_t device, unsigned int *width)
{
    return put_uint(device, UNSUP_PCIE, width, device ? device->pcie_width_max : 0);
}

EXPORT nvmlReturn_t nvmlDeviceGetCurrPcieLinkGeneration(nvmlDevice_t device, unsigned int *gen)
{
    return put_uint(device, UNSUP_PCIE, gen, device ? device->pcie_gen : 0);
}

EXPORT nvmlReturn_t nvmlDeviceGetMaxPcieLinkGeneration(nvmlDevice_t device, unsigned int *gen)
{
    return put_uint(device, UNSUP_PCIE, gen, device ? device->pcie_gen_max : 0);
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuMaxPcieLinkGeneration(nvmlDevice_t device, unsigned int *gen)
{
    return put_uint(device, UNSUP_PCIE, gen, device ? device->pcie_gen_max : 0);
}

EXPORT nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device,
                                             nvmlTemperatureSensors_t sensorType,
                                             unsigned int *temp)
{
    if (sensorType != NVML_TEMPERATURE_GPU)
        return NVML_ERROR_INVALID_ARGUMENT;
    return put_uint(device, UNSUP_TEMPERATURE, temp, device ? device->temperature : 0);
}

EXPORT nvmlReturn_t nvmlDeviceGetTemperatureThreshold(nvmlDevice_t device,
                                                      nvmlTemperatureThresholds_t thresholdType,
                                                      unsigned int *temp)
{
    if (thresholdType != NVML_TEMPERATURE_THRESHOLD_SLOWDOWN)
        return NVML_ERROR_NOT_SUPPORTED;
    return put_uint(device, UNSUP_TEMPERATURE, temp, device ? device->temperature_slowdown : 0);
}

EXPORT nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t device,
                                                           unsigned long long *reasons)
{
    nvmlReturn_t ret = touch(device, UNSUP_CLOCKS);
    if (ret != NVML_SUCCESS)
        return ret;
    if (!reasons)
        return NVML_ERROR_INVALID_ARGUMENT;
    *reasons = device->clocks_event_reasons;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t device,
                                                              unsigned long long *reasons)
{
    return nvmlDeviceGetCurrentClocksEventReasons(device, reasons);
}

/* Links 0..nvlinks-1 answer; beyond them INVALID_ARGUMENT, as a real driver does. */
EXPORT nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t device, unsigned int link,
                                             nvmlEnableState_t *isActive)
{
    nvmlReturn_t ret = touch(device, UNSUP_NVLINK);
    if (ret != NVML_SUCCESS)
        return ret;
    if (!device->nvlinks)
        return NVML_ERROR_NOT_SUPPORTED;
    if (!isActive || link >= device->nvlinks)
        return NVML_ERROR_INVALID_ARGUMENT;
    *isActive = device->nvlink_down[link] ? NVML_FEATURE_DISABLED : NVML_FEATURE_ENABLED;
    return NVML_SUCCESS;
}

static nvmlReturn_t fabric(nvmlDevice_t device, unsigned int *status, unsigned int *cliqueId,
                           nvmlGpuFabricState_t *state)
{
    nvmlReturn_t ret = touch(device, UNSUP_FABRIC);
    if (ret != NVML_SUCCESS)
        return ret;
    if (device->fabric_state < 0)
        return NVML_ERROR_NOT_SUPPORTED;
    *status = device->fabric_status;
    *cliqueId = 1;
    *state = (nvmlGpuFabricState_t)device->fabric_state;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuFabricInfo(nvmlDevice_t device, nvmlGpuFabricInfo_t *info)
{
    unsigned int status = 0;
    nvmlReturn_t ret;
    if (!info)
        return NVML_ERROR_INVALID_ARGUMENT;
    memset(info, 0, sizeof *info);
    ret = fabric(device, &status, &info->cliqueId, &info->state);
    info->status = (nvmlReturn_t)status;
    return ret;
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuFabricInfoV(nvmlDevice_t device, nvmlGpuFabricInfoV_t *info)
{
    unsigned int status = 0;
    nvmlReturn_t ret;
    if (!info)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (info->version != nvmlGpuFabricInfo_v2)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH; /* only v2 is answered here */
    nvmlGpuFabricInfo_v2_t *v2 = (nvmlGpuFabricInfo_v2_t *)info;
    unsigned int version = v2->version;
    memset(v2, 0, sizeof *v2);
    v2->version = version;
    ret = fabric(device, &status, &v2->cliqueId, &v2->state);
    v2->status = (nvmlReturn_t)status;
    return ret;
}

/* cpuSetSize words of 64 bits, CPU 0 in the lowest bit of the first. */
EXPORT nvmlReturn_t nvmlDeviceGetCpuAffinity(nvmlDevice_t device, unsigned int cpuSetSize,
                                             unsigned long *cpuSet)
{
    nvmlReturn_t ret = touch(device, UNSUP_AFFINITY);
    if (ret != NVML_SUCCESS)
        return ret;
    if (!cpuSet || !cpuSetSize)
        return NVML_ERROR_INVALID_ARGUMENT;
    for (unsigned int w = 0; w < cpuSetSize; w++) {
        unsigned long long word = 0;
        if (device->has_cpu_affinity) {
            word = w < CPU_WORDS ? device->cpu_affinity[w] : 0;
        } else {
            long n = sysconf(_SC_NPROCESSORS_CONF);
            for (long c = (long)w * 64; c < n && c < (long)(w + 1) * 64; c++)
                word |= 1ULL << (c % 64);
        }
        cpuSet[w] = (unsigned long)word;
    }
    return NVML_SUCCESS;
}

/* ---- MIG devices --------------------------------------------------------------------- */

static int is_mig(nvmlDevice_t dev)
{
    return dev >= &migs[0][0] && dev < &migs[0][0] + MAX_GPUS * MAX_MIGS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t device, unsigned int *count)
{
    nvmlReturn_t ret = touch(device, UNSUP_MIG);
    if (ret != NVML_SUCCESS)
        return ret;
    if (!count || is_mig(device))
        return NVML_ERROR_INVALID_ARGUMENT;
    *count = device->mig_current ? MAX_MIGS : 0;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t device, unsigned int index,
                                                        nvmlDevice_t *migDevice)
{
    nvmlReturn_t ret = touch(device, UNSUP_MIG);
    if (ret != NVML_SUCCESS)
        return ret;
    if (!migDevice || is_mig(device) || index >= MAX_MIGS)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!device->mig_current || (int)index >= device->nmigs)
        return NVML_ERROR_NOT_FOUND;
    *migDevice = &migs[device - gpus][index];
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t device, unsigned int *isMigDevice)
{
    nvmlReturn_t ret = touch(device, 0);
    if (ret != NVML_SUCCESS)
        return ret;
    if (!isMigDevice)
        return NVML_ERROR_INVALID_ARGUMENT;
    *isMigDevice = is_mig(device) ? 1 : 0;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t migDevice,
                                                                 nvmlDevice_t *device)
{
    nvmlReturn_t ret = touch(migDevice, 0);
    if (ret != NVML_SUCCESS)
        return ret;
    if (!device || !is_mig(migDevice))
        return NVML_ERROR_INVALID_ARGUMENT;
    *device = migDevice->parent;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t device, unsigned int *id)
{
    nvmlReturn_t ret = touch(device, 0);
    if (ret != NVML_SUCCESS)
        return ret;
    if (!id || !is_mig(device))
        return NVML_ERROR_INVALID_ARGUMENT;
    *id = device->gpu_instance;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t device, unsigned int *id)
{
    nvmlReturn_t ret = touch(device, 0);
    if (ret != NVML_SUCCESS)
        return ret;
    if (!id || !is_mig(device))
        return NVML_ERROR_INVALID_ARGUMENT;
    *id = device->compute_instance;
    return NVML_SUCCESS;
}

/* ---- power limit, page retirement ----------------------------------------------------- */

EXPORT nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t device, unsigned int *limit)
{
    return put_uint(device, UNSUP_POWER, limit, device ? device->power_limit : 0);
}

EXPORT nvmlReturn_t nvmlDeviceGetPowerManagementLimit(nvmlDevice_t device, unsigned int *limit)
{
    return put_uint(device, UNSUP_POWER, limit, device ? device->power_limit : 0);
}

EXPORT nvmlReturn_t nvmlDeviceGetPowerManagementDefaultLimit(nvmlDevice_t device,
                                                             unsigned int *limit)
{
    return put_uint(device, UNSUP_POWER, limit, device ? device->power_limit_default : 0);
}

EXPORT nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned int *power)
{
    nvmlReturn_t ret = touch(device, UNSUP_POWER);
    if (ret != NVML_SUCCESS)
        return ret;
    if (!power)
        return NVML_ERROR_INVALID_ARGUMENT;
    refresh_usage();
    *power = device->power_usage;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetRetiredPagesPendingStatus(nvmlDevice_t device,
                                                           nvmlEnableState_t *isPending)
{
    nvmlReturn_t ret = touch(device, UNSUP_RETIRED);
    if (ret != NVML_SUCCESS)
        return ret;
    if (!isPending)
        return NVML_ERROR_INVALID_ARGUMENT;
    *isPending = device->retired_pages_pending ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED;
    return NVML_SUCCESS;
}

/* ---- events: Xid critical errors ------------------------------------------------------ */

#define STANDIN_EVENT_TYPES (nvmlEventTypeXidCriticalError | nvmlEventTypeSingleBitEccError | \
                             nvmlEventTypeDoubleBitEccError)

EXPORT nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set)
{
    if (!refcount)
        return NVML_ERROR_UNINITIALIZED;
    if (!set)
        return NVML_ERROR_INVALID_ARGUMENT;
    for (int i = 0; i < MAX_EVENT_SETS; i++) {
        if (!event_sets[i].used) {
            memset(&event_sets[i], 0, sizeof event_sets[i]);
            event_sets[i].used = 1;
            *set = &event_sets[i];
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_INSUFFICIENT_RESOURCES;
}

static int event_set_ok(nvmlEventSet_t set)
{
    return set && set >= event_sets && set < event_sets + MAX_EVENT_SETS && set->used;
}

EXPORT nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set)
{
    if (!refcount)
        return NVML_ERROR_UNINITIALIZED;
    if (!event_set_ok(set))
        return NVML_ERROR_INVALID_ARGUMENT;
    set->used = 0;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t device,
                                                     unsigned long long *eventTypes)
{
    nvmlReturn_t ret = touch(device, UNSUP_EVENTS);
    if (ret != NVML_SUCCESS)
        return ret;
    if (!eventTypes || device->parent)
        return NVML_ERROR_INVALID_ARGUMENT;
    *eventTypes = STANDIN_EVENT_TYPES;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long eventTypes,
                                             nvmlEventSet_t set)
{
    nvmlReturn_t ret = touch(device, UNSUP_EVENTS);
    if (ret != NVML_SUCCESS)
        return ret;
    if (!event_set_ok(set) || device->parent)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (eventTypes & ~(unsigned long long)STANDIN_EVENT_TYPES)
        return NVML_ERROR_NOT_SUPPORTED;
    set->registered[device - gpus] |= eventTypes;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data,
                                        unsigned int timeoutms)
{
    if (!refcount)
        return NVML_ERROR_UNINITIALIZED;
    if (!event_set_ok(set) || !data)
        return NVML_ERROR_INVALID_ARGUMENT;
    for (unsigned int i = 0; i < gpu_count; i++) {
        struct nvmlDevice_st *g = &gpus[i];
        if (!(set->registered[i] & nvmlEventTypeXidCriticalError) ||
            set->delivered[i] >= g->nxids)
            continue;
        data->device = g;
        data->eventType = nvmlEventTypeXidCriticalError;
        data->eventData = g->xids[set->delivered[i]++];
        data->gpuInstanceId = 0xFFFFFFFFu;
        data->computeInstanceId = 0xFFFFFFFFu;
        return NVML_SUCCESS;
    }
    if (timeoutms) { /* nothing will come: wait as asked (bounded to a second), then say so */
        struct timespec ts = {0, 0};
        unsigned int ms = timeoutms > 1000 ? 1000 : timeoutms;
        ts.tv_sec = ms / 1000;
        ts.tv_nsec = (long)(ms % 1000) * 1000000L;
        while (nanosleep(&ts, &ts) && errno == EINTR)
            ;
    }
    return NVML_ERROR_TIMEOUT;
}

EXPORT nvmlReturn_t nvmlEventSetWait(nvmlEventSet_t set, nvmlEventData_t *data,
                                     unsigned int timeoutms)
{
    return nvmlEventSetWait_v2(set, data, timeoutms);
}
