/* secret.h - the remote tier's MAC secret for tests: a file of 32 bytes, mode 0600, made once
 * per process and removed at its exit. Header only: the remote tests link no library of ours
 * but the suite. */
#pragma once
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char h_secret_path[64];

static void h_secret_remove(void)
{
	if (h_secret_path[0])
		unlink(h_secret_path);
}

/* "file:PATH" of the test secret (the [remote] section's `secret = ` value), or NULL. Every
 * kvpoold of one test holds the same secret: they are one deployment. */
static inline const char *h_secret_src(void)
{
	static char src[80];
	int fd;

	if (src[0])
		return src;
	snprintf(h_secret_path, sizeof(h_secret_path), "/tmp/kvp-secret.XXXXXX");
	fd = mkstemp(h_secret_path); /* mode 0600 */
	if (fd < 0)
		return NULL;
	if (write(fd, "kvpool-test-secret-0123456789abc\n", 33) != 33) {
		close(fd);
		return NULL;
	}
	close(fd);
	atexit(h_secret_remove);
	snprintf(src, sizeof(src), "file:%s", h_secret_path);
	return src;
}

/* The secret's bytes (what kvpoold reads from the file: the line end dropped). */
#define H_SECRET "kvpool-test-secret-0123456789abc"
