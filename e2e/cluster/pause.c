/* Pod sandbox "pause" process for the local test cluster's own pause image.
 * It holds the pod's namespaces, reaps zombies (it is PID 1 when the pod shares its PID namespace) and exits
 * cleanly on SIGTERM or SIGINT. Built with `gcc -static` so the image needs no libc. */
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static void on_stop(int sig) {
    (void)sig;
    _exit(0);
}

static void on_child(int sig) {
    (void)sig;
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
}

int main(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_stop;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    sa.sa_handler = on_child;
    sa.sa_flags = SA_NOCLDSTOP | SA_RESTART;
    sigaction(SIGCHLD, &sa, NULL);
    for (;;) {
        pause();
    }
}
