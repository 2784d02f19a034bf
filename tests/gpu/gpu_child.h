/* gpu_child.h - what the multi-process GPU tests share: the parent never touches CUDA, so each
 * CUDA step runs in a child, and a child's probe decides skip (77) or failure. Header only. */
#pragma once
#include <errno.h>
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cuda_drv.h"

/* Runs fn in a child; its exit status, or 128 + the signal that ended it. */
static inline int h_gpu_run_child(int (*fn)(void))
{
	pid_t pid = fork();
	int st;

	if (pid == 0)
		_exit(fn());
	waitpid(pid, &st, 0);
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* For a child: 0 with a usable GPU, 77 (printed SKIP and why) without one, 1 (FAIL) when a GPU
 * is there but kvpool cannot drive it. */
static inline int h_gpu_probe(void)
{
	char why[256] = "";
	int n = kvp_cuda_probe(why, sizeof(why));

	if (n == -ENODEV || n == -ENOTSUP) {
		printf("SKIP: no usable GPU: %s\n", why);
		fflush(stdout); /* a child's _exit drops buffered output */
		return 77;
	}
	if (n < 1) {
		printf("FAIL: kvp_cuda_probe = %d: %s\n", n, why);
		fflush(stdout);
		return 1;
	}
	return 0;
}
