/*
 * pause: the sandbox ("infra") container process of a Kubernetes pod.
 *
 * It holds the pod's namespaces open and does nothing else: it sleeps
 * (sigsuspend(2), the race-free pause(2)), reaps any child that gets re-parented to it (it is PID 1 of the
 * pod's PID namespace when the namespace is shared), and exits cleanly on
 * SIGINT or SIGTERM. Build: gcc -static -O2 -o pause pause.c
 *
 * Written for kube-harness; behaves like the upstream pause image.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef PAUSE_VERSION
#define PAUSE_VERSION "kube-harness"
#endif

static volatile sig_atomic_t stop_signal;

static void on_stop(int sig) { stop_signal = sig; }

static void on_child(int sig) {
	int saved = errno;
	(void)sig;
	while (waitpid(-1, NULL, WNOHANG) > 0) {
	}
	errno = saved;
}

static void handle(int sig, void (*fn)(int)) {
	struct sigaction sa;
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = fn;
	sigemptyset(&sa.sa_mask);
	sa.sa_flags = sig == SIGCHLD ? SA_NOCLDSTOP | SA_RESTART : 0;
	if (sigaction(sig, &sa, NULL) < 0) {
		perror("pause: sigaction");
		exit(1);
	}
}

int main(int argc, char **argv) {
	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "-v") == 0 || strcmp(argv[i], "--version") == 0) {
			printf("pause.c %s\n", PAUSE_VERSION);
			return 0;
		}
	}
	if (getpid() != 1)
		fprintf(stderr, "Warning: pause should be the first process\n");

	handle(SIGINT, on_stop);
	handle(SIGTERM, on_stop);
	handle(SIGCHLD, on_child);

	/* SIGINT/SIGTERM are blocked except inside sigsuspend(), so a signal that
	 * arrives between the check and the wait cannot be lost (the race a bare
	 * pause() loop has). */
	sigset_t block, orig;
	sigemptyset(&block);
	sigaddset(&block, SIGINT);
	sigaddset(&block, SIGTERM);
	sigprocmask(SIG_BLOCK, &block, &orig);
	sigdelset(&orig, SIGINT);
	sigdelset(&orig, SIGTERM);
	while (!stop_signal)
		sigsuspend(&orig);
	fprintf(stderr, "Shutting down, got signal: %s\n", stop_signal == SIGINT ? "Interrupt" : "Terminated");
	return 0;
}
