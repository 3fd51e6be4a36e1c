/* A misbehaving agent program for the container tests: a tiny HTTP server
 * on 127.0.0.1:$PORT (the container's loopback, as protocol §10 has it)
 * that registers anything and answers a loop according to its arguments:
 *
 *   memory    one chunk, then allocates and touches memory until killed
 *   child     one chunk, then a child allocates and touches memory until
 *             killed; the loop's body then ends cut short (no last chunk)
 *             and the program itself lives on, listening
 *   hungry    allocates and touches memory until killed, before it listens
 *   disk      says its memory limit as its cgroup shows it, fills /tmp and
 *             then / until ENOSPC, and says what it saw
 *   stubborn  ignores SIGTERM, forks children that ignore it too (one in a
 *             session of its own), and answers one chunk
 *   once      exits right after its first connection (the readiness probe)
 *   dies      one chunk, then exits with status 3 in the middle of its loop
 *   silent    never listens
 *   tenant MS registers once only (a second registration is refused and
 *             says "crossing"); a loop waits MS milliseconds, then answers
 *             one chunk with the letters and digits of its registration and
 *             of its run request: a run can check the agent is its own
 *   reach A:P...  a loop tries to connect to each IPv4 address:port of
 *             its arguments, then of its run request (the prompt), and
 *             answers "A:P connected" or "A:P <error>" for each
 *   cat PATH  answers one chunk with the text of the file PATH, or the
 *             error that opening it gave
 *   escape    tries what a hostile image would (escape.c) and answers one
 *             chunk per probe, `NAME: WHAT HAPPENED`; a fork bomb too when
 *             the prompt says "fork bomb"
 *   mark      answers one chunk: "seen HOST<host of the run before>" when
 *             /mark or /tmp/mark was there (an earlier run's), else
 *             "fresh HOST", its memory limit and the room left on /tmp;
 *             then leaves its own marks
 *   plain     answers one chunk and leaves every signal as it is (PID 1
 *             without an init then ignores SIGTERM)
 *
 * With LISTEN_ANY=1 in its environment it listens on every address of
 * its network namespace (0.0.0.0:$PORT), not only on the loopback: a run
 * another run must not reach even where it listens.
 *
 * Built static by the tests (gcc -static), so the image needs no libraries.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <arpa/inet.h>
#include <ctype.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/time.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

static void send_event(int fd, const char *text);
#include "escape.c"

static const char *mode = "";
static int arg_count = 0;
static char **args = NULL;
/* tenant: the letters and digits of its one registration, if any. */
static char registration[256] = "";
static int registered = 0;

/* The letters and digits of TEXT, at most SIZE - 1 of them, into OUT. */
static void alnum(const char *text, char *out, size_t size) {
    size_t n = 0;
    for (; *text && n + 1 < size; text++) {
        if (isalnum((unsigned char)*text)) out[n++] = *text;
    }
    out[n] = 0;
}

/* reach: tries A:P (connect, 4 s at most: a refusal the host sends as
 * ICMP is rate-limited, and may come with the SYN sent again after 1 s);
 * writes the outcome to OUT. */
static void reach(const char *target, char *out, size_t size) {
    char host[64];
    const char *colon = strrchr(target, ':');
    if (!colon || (size_t)(colon - target) >= sizeof host) {
        snprintf(out, size, "%s unparsed", target);
        return;
    }
    memcpy(host, target, (size_t)(colon - target));
    host[colon - target] = 0;
    struct sockaddr_in addr = {0};
    addr.sin_family = AF_INET;
    addr.sin_port = htons((unsigned short)atoi(colon + 1));
    if (inet_pton(AF_INET, host, &addr.sin_addr) != 1) {
        snprintf(out, size, "%s unparsed", target);
        return;
    }
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct timeval timeout = {4, 0};
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof timeout);
    if (connect(fd, (struct sockaddr *)&addr, sizeof addr) == 0) {
        snprintf(out, size, "%s connected", target);
    } else {
        snprintf(out, size, "%s %s", target, strerror(errno));
    }
    close(fd);
}

/* Whether a failed read or write on FD may be tried again: runsc's host
 * network (Debian's 2022 build) hands out accepted sockets that answer
 * EAGAIN although they were never made non-blocking. */
static int again(int fd, short events) {
    if (errno != EAGAIN && errno != EINTR) return 0;
    struct pollfd wait = {.fd = fd, .events = events};
    return poll(&wait, 1, 10000) > 0;
}

static void send_all(int fd, const char *data, size_t len) {
    while (len > 0) {
        ssize_t n = write(fd, data, len);
        if (n < 0 && again(fd, POLLOUT)) continue;
        if (n <= 0) return;
        data += n;
        len -= (size_t)n;
    }
}

static void send_str(int fd, const char *text) { send_all(fd, text, strlen(text)); }

/* One chunk of a chunked body holding one SSE event with a text chunk. */
static void send_event(int fd, const char *text) {
    char event[1024], frame[1100];
    int n = snprintf(event, sizeof event,
                     "data: {\"type\":\"assistant_text_content\",\"text\":\"%s\"}\n\n", text);
    int m = snprintf(frame, sizeof frame, "%x\r\n%s\r\n", n, event);
    send_all(fd, frame, (size_t)m);
}

static const char *errno_name(int e) {
    if (e == ENOSPC) return "ENOSPC";
    if (e == EDQUOT) return "EDQUOT";
    return strerror(e);
}

/* Writes FILE until the write fails; returns the bytes written and the errno. */
static long long fill(const char *file, int *error) {
    static char block[65536];
    memset(block, 'x', sizeof block);
    int fd = open(file, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) { *error = errno; return 0; }
    long long total = 0;
    for (;;) {
        ssize_t n = write(fd, block, sizeof block);
        if (n < 0) { *error = errno; break; }
        total += n;
        if (n < (ssize_t)sizeof block) {
            if (write(fd, block, 1) < 0) *error = errno; else *error = 0;
            break;
        }
    }
    if (fsync(fd) < 0 && *error == 0) *error = errno;
    close(fd);
    return total;
}

/* Allocates and touches memory, 1 MiB at a time, until it is killed. */
static void eat(void) {
    for (;;) {
        char *block = malloc(1 << 20);
        if (block == NULL) continue;
        memset(block, 1, 1 << 20);
    }
}

/* The memory limit the container's cgroup shows (v1, then v2), or -1. */
static long long memory_limit(void) {
    const char *files[] = {"/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory.max"};
    for (int i = 0; i < 2; i++) {
        FILE *file = fopen(files[i], "r");
        if (!file) continue;
        long long limit = -1;
        if (fscanf(file, "%lld", &limit) != 1) limit = -1;
        fclose(file);
        return limit;
    }
    return -1;
}

static void run_loop(int fd, const char *body) {
    send_str(fd, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                 "Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n");
    if (strcmp(mode, "tenant") == 0) {
        int hold = arg_count > 2 ? atoi(args[2]) : 0;
        if (hold > 0) usleep((useconds_t)hold * 1000);
        char request[400], text[800];
        alnum(body, request, sizeof request);
        snprintf(text, sizeof text, "registered %s; run %s", registration, request);
        send_event(fd, text);
        send_str(fd, "0\r\n\r\n");
        return;
    }
    if (strcmp(mode, "reach") == 0) {
        char text[900] = "";
        char targets[32][64];
        int count = 0;
        for (int i = 2; i < arg_count && count < 32; i++) {
            snprintf(targets[count++], sizeof targets[0], "%s", args[i]);
        }
        /* A:P in the request: a run of digits, dots and a colon. */
        for (const char *at = body; *at && count < 32;) {
            size_t len = strspn(at, "0123456789.:");
            int dots = 0, colons = 0;
            for (size_t k = 0; k < len; k++) {
                dots += at[k] == '.';
                colons += at[k] == ':';
            }
            if (len > 0 && len < sizeof targets[0] && dots == 3 && colons == 1) {
                memcpy(targets[count], at, len);
                targets[count++][len] = 0;
            }
            at += len ? len : 1;
        }
        for (int i = 0; i < count; i++) {
            char one[160];
            reach(targets[i], one, sizeof one);
            if (strlen(text) + strlen(one) + 3 < sizeof text) {
                if (text[0]) strcat(text, "; ");
                strcat(text, one);
            }
        }
        send_event(fd, text);
        send_str(fd, "0\r\n\r\n");
        return;
    }
    if (strcmp(mode, "dies") == 0) {
        send_event(fd, "dying");
        exit(3);
    }
    if (strcmp(mode, "mark") == 0) {
        /* Whether an earlier run left its marks here; then this run's. */
        char host[64] = "", before[64] = "";
        gethostname(host, sizeof host - 1);
        const char *marks[] = {"/mark", "/tmp/mark"};
        for (int i = 0; i < 2; i++) {
            FILE *seen = fopen(marks[i], "r");
            if (seen) {
                if (!fgets(before, sizeof before, seen)) snprintf(before, sizeof before, "?");
                fclose(seen);
            }
            FILE *mark = fopen(marks[i], "w");
            if (mark) {
                fputs(host, mark);
                fclose(mark);
            }
        }
        struct statvfs disk;
        long long free_bytes = statvfs("/tmp", &disk) == 0 ? (long long)disk.f_bavail * (long long)disk.f_frsize : -1;
        char text[300];
        snprintf(text, sizeof text, "%s %s%s; memory limit %lld; disk free %lld",
                 before[0] ? "seen" : "fresh", host, before, memory_limit(), free_bytes);
        send_event(fd, text);
        send_str(fd, "0\r\n\r\n");
        return;
    }
    if (strcmp(mode, "cat") == 0) {
        const char *path = arg_count > 2 ? args[2] : "";
        char text[700] = "";
        FILE *file = fopen(path, "r");
        if (!file) {
            snprintf(text, sizeof text, "%s: %s", path, strerror(errno));
        } else {
            /* JSON-escaped: the text goes into a JSON string as it is. */
            size_t n = 0;
            int c;
            while ((c = fgetc(file)) != EOF && n + 3 < sizeof text) {
                if (c == '\n') {
                    text[n++] = '\\';
                    text[n++] = 'n';
                } else if (c == '"' || c == '\\') {
                    text[n++] = '\\';
                    text[n++] = (char)c;
                } else if (c >= 32) {
                    text[n++] = (char)c;
                }
            }
            text[n] = 0;
            fclose(file);
        }
        send_event(fd, text);
        send_str(fd, "0\r\n\r\n");
        return;
    }
    if (strcmp(mode, "memory") == 0) {
        send_event(fd, "allocating");
        eat();
    }
    if (strcmp(mode, "child") == 0) {
        send_event(fd, "a child allocates");
        pid_t child = fork();
        if (child == 0) eat();
        if (child > 0) waitpid(child, NULL, 0);
        return;
    }
    if (strcmp(mode, "disk") == 0) {
        int tmp_error = 0, root_error = 0;
        long long tmp = fill("/tmp/fill", &tmp_error);
        unlink("/tmp/fill");
        long long root = fill("/fill", &root_error);
        char text[512];
        snprintf(text, sizeof text, "memory limit %lld; tmp: %s after %lld bytes; root: %s after %lld bytes",
                 memory_limit(), errno_name(tmp_error), tmp, errno_name(root_error), root);
        send_event(fd, text);
    } else if (strcmp(mode, "escape") == 0) {
        escape(fd);
        if (strstr(body, "fork bomb")) fork_bomb(fd);
    } else {
        send_event(fd, "still here");
    }
    send_str(fd, "0\r\n\r\n");
}

static void serve(int fd) {
    char request[65536];
    size_t len = 0;
    char *end = NULL;
    while (len < sizeof request - 1) {
        ssize_t n = read(fd, request + len, sizeof request - 1 - len);
        if (n < 0 && again(fd, POLLIN)) continue;
        if (n <= 0) return;
        len += (size_t)n;
        request[len] = 0;
        end = strstr(request, "\r\n\r\n");
        if (end) break;
    }
    if (!end) return;
    const char *length = strcasestr(request, "content-length:");
    size_t body = length ? (size_t)atol(length + 15) : 0;
    size_t have = len - (size_t)(end + 4 - request);
    while (have < body && len < sizeof request - 1) {
        ssize_t n = read(fd, request + len, sizeof request - 1 - len);
        if (n <= 0) return;
        len += (size_t)n;
        have += (size_t)n;
        request[len] = 0;
    }
    while (have < body) {
        char sink[4096];
        ssize_t n = read(fd, sink, sizeof sink);
        if (n < 0 && again(fd, POLLIN)) continue;
        if (n <= 0) return;
        have += (size_t)n;
    }
    const char *content = strstr(request, "\r\n\r\n") + 4;
    if (strncmp(request, "POST /register", 14) == 0) {
        if (strcmp(mode, "tenant") == 0 && registered) {
            const char *refusal = "{\"kind\":\"agent\",\"error\":\"crossing: registered twice\"}";
            char head[200];
            snprintf(head, sizeof head,
                     "HTTP/1.1 409 Conflict\r\nContent-Type: application/json\r\n"
                     "Content-Length: %zu\r\nConnection: close\r\n\r\n", strlen(refusal));
            send_str(fd, head);
            send_str(fd, refusal);
            fprintf(stderr, "crossing: a second registration\n");
            return;
        }
        registered = 1;
        alnum(content, registration, sizeof registration);
        send_str(fd, "HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n");
    } else if (strncmp(request, "POST /run", 9) == 0) {
        run_loop(fd, content);
    } else {
        send_str(fd, "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
    }
}

int main(int argc, char **argv) {
    if (argc > 1) mode = argv[1];
    arg_count = argc;
    args = argv;
    if (strcmp(mode, "silent") == 0) {
        for (;;) pause();
    }
    if (strcmp(mode, "hungry") == 0) eat();
    const char *port_text = getenv("PORT");
    int port = port_text ? atoi(port_text) : 8080;
    if (port <= 0 || port > 65535) port = 8080;
    signal(SIGPIPE, SIG_IGN);
    if (strcmp(mode, "stubborn") == 0) {
        signal(SIGTERM, SIG_IGN);
        for (int i = 0; i < 3; i++) {
            if (fork() == 0) {
                if (i == 0) setsid();
                for (;;) pause();
            }
        }
    }
    int server = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(server, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in addr = {0};
    addr.sin_family = AF_INET;
    addr.sin_port = htons((unsigned short)port);
    const char *any = getenv("LISTEN_ANY");
    addr.sin_addr.s_addr = htonl(any && strcmp(any, "1") == 0 ? INADDR_ANY : INADDR_LOOPBACK);
    if (bind(server, (struct sockaddr *)&addr, sizeof addr) < 0 || listen(server, 16) < 0) {
        perror("listen");
        return 1;
    }
    for (;;) {
        int fd = accept(server, NULL, NULL);
        if (fd < 0) continue;
        if (strcmp(mode, "once") == 0) return 0;
        serve(fd);
        close(fd);
    }
}
