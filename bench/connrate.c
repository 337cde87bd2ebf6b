/* New TCP connections per second: the data-plane bench's short-lived-connection generator.
 *
 * Debian has no packaged tool that opens and closes TCP connections as fast as it can and
 * reports the rate (iperf3 measures throughput; hping3/nping send raw SYNs that never become
 * connections), so bench/dataplane.py compiles this at run time with gcc.
 *
 *   connrate server PORT              accept, close at once; forever (the bench kills it)
 *   connrate client ADDR PORT SECONDS WORKERS
 *       WORKERS processes each loop: connect, wait for the server's close (read() == 0: the
 *       connection was accepted), close with SO_LINGER 0 (an RST, so no TIME_WAIT exhausts
 *       the ports). Prints "<connections> <failures> <seconds> <cpu seconds>" on stdout: the
 *       last is the workers' user + system time, which (no IRQ time accounting on the bench's
 *       kernels: softirqs are charged to the task they interrupt) includes the kernel's packet
 *       work done in their context: the client side's connection, through NAT and bridge, up to
 *       the server's SYN-ACK. Other processes' load does not add to it, as it does to the rate.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static int server(int port) {
    int s = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port), .sin_addr.s_addr = htonl(INADDR_ANY)};
    setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (s < 0 || bind(s, (struct sockaddr *)&a, sizeof a) || listen(s, 4096)) {
        perror("connrate server");
        return 1;
    }
    printf("listening\n");
    fflush(stdout);
    for (;;) {
        int c = accept(s, NULL, NULL);
        if (c >= 0)
            close(c);
    }
}

static int client(const char *addr, int port, double seconds, int workers) {
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    if (inet_pton(AF_INET, addr, &a.sin_addr) != 1) {
        fprintf(stderr, "connrate: bad address %s\n", addr);
        return 2;
    }
    long *counts = mmap(NULL, 2 * workers * sizeof(long), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    double start = now(), end = start + seconds;
    for (int w = 0; w < workers; w++) {
        if (fork() == 0) {
            long ok = 0, failed = 0;
            struct linger lg = {1, 0};
            struct timeval tv = {2, 0};
            char b;
            while (now() < end) {
                int s = socket(AF_INET, SOCK_STREAM, 0);
                setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
                setsockopt(s, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
                if (connect(s, (struct sockaddr *)&a, sizeof a) == 0 && read(s, &b, 1) == 0)
                    ok++;
                else
                    failed++;
                setsockopt(s, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
                close(s);
            }
            counts[2 * w] = ok;
            counts[2 * w + 1] = failed;
            _exit(0);
        }
    }
    while (wait(NULL) > 0)
        ;
    long ok = 0, failed = 0;
    for (int w = 0; w < workers; w++) {
        ok += counts[2 * w];
        failed += counts[2 * w + 1];
    }
    struct rusage ru;
    getrusage(RUSAGE_CHILDREN, &ru);
    double cpu = ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 + ru.ru_stime.tv_sec + ru.ru_stime.tv_usec / 1e6;
    printf("%ld %ld %.6f %.6f\n", ok, failed, now() - start, cpu);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 3 && strcmp(argv[1], "server") == 0)
        return server(atoi(argv[2]));
    if (argc == 6 && strcmp(argv[1], "client") == 0)
        return client(argv[2], atoi(argv[3]), atof(argv[4]), atoi(argv[5]));
    fprintf(stderr, "usage: connrate server PORT | connrate client ADDR PORT SECONDS WORKERS\n");
    return 2;
}
