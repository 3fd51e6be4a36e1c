/* The escape probes of the hog's `escape` mode: what a hostile image tries
 * from inside its container, each answered as one chunk `NAME: RESULT`.
 * RESULT is `ok` or an errno name for a call, a file's text (lines joined
 * with `|`) or a count. The container tests read them and say which
 * control each one proves. Included by hog.c (which has the HTTP server).
 */
#include <linux/perf_event.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <dirent.h>

static char report[900]; /* send_event holds 1024 bytes with its JSON */

/* The errno of a failed call as its name, or "ok". */
static const char *outcome(long result) {
    if (result >= 0) return "ok";
    switch (errno) {
    case EPERM: return "EPERM";
    case ENOSYS: return "ENOSYS";
    case EACCES: return "EACCES";
    case EROFS: return "EROFS";
    case EINVAL: return "EINVAL";
    case ENOENT: return "ENOENT";
    case EAGAIN: return "EAGAIN";
    default: return strerror(errno);
    }
}

/* Sends NAME: TEXT, TEXT made JSON-safe (quotes and backslashes dropped,
 * control characters and newlines as `|`). */
static void say(int fd, const char *name, const char *text) {
    size_t at = (size_t)snprintf(report, sizeof report, "%s: ", name);
    for (const char *c = text; *c && at + 2 < sizeof report; c++) {
        if (*c == '"' || *c == '\\') continue;
        report[at++] = (*c == '\n' || (unsigned char)*c < 0x20) ? '|' : *c;
    }
    while (at > 0 && report[at - 1] == '|') at--;
    report[at] = 0;
    send_event(fd, report);
}

/* The start of FILE (NULs as spaces), or `ERRNO` if it does not open. */
static void say_file(int fd, const char *name, const char *file) {
    static char text[2048];
    int in = open(file, O_RDONLY);
    if (in < 0) { say(fd, name, outcome(-1)); return; }
    ssize_t n = read(in, text, sizeof text - 1);
    close(in);
    for (ssize_t i = 0; i < n; i++) {
        if (text[i] == 0) text[i] = ' ';
    }
    text[n > 0 ? n : 0] = 0;
    say(fd, name, n < 0 ? outcome(-1) : text);
}

/* The line of /proc/self/status that starts with KEY. */
static void say_status(int fd, const char *key) {
    static char line[512];
    FILE *status = fopen("/proc/self/status", "r");
    if (!status) { say(fd, key, outcome(-1)); return; }
    while (fgets(line, sizeof line, status)) {
        if (strncmp(line, key, strlen(key)) == 0 && line[strlen(key)] == ':') {
            char *value = line + strlen(key) + 1;
            while (*value == ' ' || *value == '\t') value++;
            say(fd, key, value);
            break;
        }
    }
    fclose(status);
}

/* Entries of a directory (no . and ..), or -1. */
static long entries(const char *path) {
    DIR *dir = opendir(path);
    if (!dir) return -1;
    long count = 0;
    struct dirent *entry;
    while ((entry = readdir(dir))) {
        if (strcmp(entry->d_name, ".") && strcmp(entry->d_name, "..")) count++;
    }
    closedir(dir);
    return count;
}

static void say_count(int fd, const char *name, long count) {
    char text[32];
    snprintf(text, sizeof text, "%ld", count);
    say(fd, name, count < 0 ? outcome(-1) : text);
}

/* A child made with clone(FLAGS): ok if it could be made. */
static long clone_with(unsigned long flags) {
    long pid = syscall(SYS_clone, flags | SIGCHLD, 0, 0, 0, 0);
    if (pid == 0) _exit(0);
    if (pid > 0) waitpid((pid_t)pid, NULL, 0);
    return pid;
}

/* unshare(FLAGS) in a child of its own (it would change this process's
 * namespaces): its outcome, as if called here. */
static long unshare_in_child(int flags) {
    pid_t pid = fork();
    if (pid == 0) _exit(unshare(flags) == 0 ? 0 : errno);
    int status = 0;
    if (pid < 0 || waitpid(pid, &status, 0) < 0) return -1;
    if (!WIFEXITED(status)) { errno = EINTR; return -1; }
    errno = WEXITSTATUS(status);
    return errno == 0 ? 0 : -1;
}

/* A fork bomb, held: children that wait forever, made until fork fails.
 * Its answer is `COUNT ERRNO` (the children made, then why the next was
 * refused); the children are killed and reaped before it answers, so the
 * run goes on. A bound of 100000 stops a runtime that holds nothing. Only
 * when the prompt asks for it: under runsc the bomb ends the sandbox. */
static void fork_bomb(int fd) {
    static pid_t children[100000];
    long made = 0;
    const char *why = "no bound";
    while (made < (long)(sizeof children / sizeof children[0])) {
        pid_t pid = fork();
        if (pid == 0) {
            for (;;) pause();
        }
        if (pid < 0) {
            why = outcome(-1);
            break;
        }
        children[made++] = pid;
    }
    for (long i = 0; i < made; i++) kill(children[i], SIGKILL);
    for (long i = 0; i < made; i++) waitpid(children[i], NULL, 0);
    char text[64];
    snprintf(text, sizeof text, "%ld %s", made, why);
    say(fd, "fork bomb", text);
}

static void escape(int fd) {
    say_file(fd, "kernel", "/proc/sys/kernel/osrelease");
    say_file(fd, "uid_map", "/proc/self/uid_map");
    say_file(fd, "gid_map", "/proc/self/gid_map");
    say_status(fd, "Seccomp");
    say_status(fd, "NoNewPrivs");
    say_status(fd, "CapEff");
    say_status(fd, "CapBnd");
    say(fd, "unshare user", outcome(unshare_in_child(CLONE_NEWUSER)));
    say(fd, "unshare user+mount", outcome(unshare_in_child(CLONE_NEWUSER | CLONE_NEWNS)));
    say(fd, "unshare net", outcome(unshare_in_child(CLONE_NEWNET)));
    say(fd, "clone user", outcome(clone_with(CLONE_NEWUSER)));
    say(fd, "clone plain", outcome(clone_with(0)));
    long ring[30] = {0};
    say(fd, "io_uring_setup", outcome(syscall(425, 1, ring)));
    struct perf_event_attr attr = {0};
    attr.size = sizeof attr;
    attr.type = PERF_TYPE_SOFTWARE;
    attr.config = PERF_COUNT_SW_CPU_CLOCK;
    say(fd, "perf_event_open", outcome(syscall(SYS_perf_event_open, &attr, 0, -1, -1, 0)));
    say(fd, "mount", outcome(mount("none", "/tmp", "tmpfs", 0, NULL)));
    say(fd, "keyctl", outcome(syscall(SYS_keyctl, 0 /* KEYCTL_GET_KEYRING_ID */, -3, 0)));
    say(fd, "add_key", outcome(syscall(SYS_add_key, "user", "probe", "x", 1, -3)));
    say(fd, "bpf", outcome(syscall(SYS_bpf, 0, NULL, 0)));
    say(fd, "mknod", outcome(mknod("/tmp/null", S_IFCHR | 0600, makedev(1, 3))));
    say(fd, "raw socket", outcome(socket(AF_INET, SOCK_RAW, IPPROTO_ICMP)));
    say_file(fd, "kcore", "/proc/kcore");
    say_file(fd, "keys", "/proc/keys");
    say_file(fd, "timer_list", "/proc/timer_list");
    say_count(fd, "sys firmware", entries("/sys/firmware"));
    say(fd, "proc sys write", outcome(open("/proc/sys/kernel/domainname", O_WRONLY)));
    say(fd, "sysrq-trigger write", outcome(open("/proc/sysrq-trigger", O_WRONLY)));
    say_count(fd, "sys block", entries("/sys/block"));
    say_count(fd, "sys class block", entries("/sys/class/block"));
    say_file(fd, "partitions", "/proc/partitions");
    say_file(fd, "diskstats", "/proc/diskstats");
    say_file(fd, "cpu quota", "/sys/fs/cgroup/cpu/cpu.cfs_quota_us");
    say_file(fd, "cpu period", "/sys/fs/cgroup/cpu/cpu.cfs_period_us");
    struct rlimit files;
    char text[64];
    getrlimit(RLIMIT_NOFILE, &files);
    snprintf(text, sizeof text, "%llu %llu", (unsigned long long)files.rlim_cur,
             (unsigned long long)files.rlim_max);
    say(fd, "nofile", text);
    snprintf(text, sizeof text, "%d", (int)getpid());
    say(fd, "pid", text);
    say_file(fd, "pid 1", "/proc/1/cmdline");
    int made = open("/probe", O_WRONLY | O_CREAT | O_TRUNC, 0644);
    say(fd, "write root", outcome(made));
    if (made >= 0) close(made);
    made = open("/tmp/probe", O_WRONLY | O_CREAT | O_TRUNC, 0644);
    say(fd, "write tmp", outcome(made));
    if (made >= 0) close(made);
}
