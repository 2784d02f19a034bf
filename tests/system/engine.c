/* engine.c - kvpool-system-engine: the engine tests/system/run.sh drives inside a container
 * booted with systemd.
 *
 *   kvpool-system-engine [--socket PATH] [--pool NAME] [--seed N] [--pages N] hold
 *     publishes a prefix of N pages (tokens and K/V bytes a function of the seed), keeps a
 *     lease of two pages with a marker written into them, prints "ready ..." and then answers
 *     commands read from stdin, one line each:
 *       check   the prefix matches whole with the same bytes (read through the mapping made at
 *               attach), the lease is still this session's, the tier mappings are the same
 *               memory (address and memfd) as at the start: "ok ..." or "fail ...";
 *       quit    exits 0.
 *   kvpool-system-engine [...] verify
 *     one match of the seed's prefix: every matched page must hold the seed's bytes. Prints
 *     "hit N pages" or "miss" and exits 0, or "fail ..." and exits 1.
 *
 * A call that fails in check is retried for up to --retry-ms (a daemon that restarts may
 * answer one retryable error first); the codes seen are printed. */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "kvpool.h"

struct engine {
	const char *socket, *pool;
	uint64_t seed;
	uint32_t npages, retry_ms;
	struct kvp_client *c;
	struct kvp_pool *p;
	struct kvp_geometry g;
	uint32_t *tokens, ntokens;
	uint64_t lease;
	uint32_t lease_pages[2];
	void *base[KVP_TIER_MAX];
	struct stat st[KVP_TIER_MAX];
	char seen[256]; /* codes of failed calls retried in one check */
};

static uint64_t mix(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ULL;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
	return x ^ (x >> 31);
}

static uint64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* Byte i of the row (token position pos, layer, kv) of this seed's prefix. */
static uint8_t row_byte(const struct engine *x, uint32_t pos, uint32_t layer, uint32_t kv,
			uint64_t i)
{
	uint64_t s = mix(x->seed ^ ((uint64_t)pos << 20) ^ ((uint64_t)layer << 44) ^
			 ((uint64_t)kv << 60) ^ (i / 8));

	return (uint8_t)(s >> (8 * (i % 8)));
}

/* Writes (fill) or compares the rows of tokens [from, to) held by pages[] of tier, pages[0]
 * holding token `first`. Returns 0, or -1 with the first difference printed into why. */
static int rows(struct engine *x, int tier, const uint32_t *pages, uint32_t first, uint32_t from,
		uint32_t to, int fill, char *why, size_t whylen)
{
	uint64_t rb = kvp_pool_row_bytes(x->p);
	uint32_t pt = x->g.page_tokens;

	for (uint32_t pos = from; pos < to; pos++) {
		uint32_t page = pages[(pos - first) / pt], tok = (pos - first) % pt;

		for (uint32_t l = 0; l < x->g.layers; l++) {
			for (uint32_t kv = 0; kv < 2; kv++) {
				uint8_t *a = kvp_pool_slot_addr(x->p, tier, l, kv, page, tok);

				if (!a) {
					snprintf(why, whylen, "no address for %s page %u",
						 kvp_tier_name(tier), page);
					return -1;
				}
				for (uint64_t i = 0; i < rb; i++) {
					uint8_t want = row_byte(x, pos, l, kv, i);

					if (fill) {
						a[i] = want;
					} else if (a[i] != want) {
						snprintf(
							why, whylen,
							"mismatch: token %u layer %u kv %u byte %lu "
							"of %s page %u",
							pos, l, kv, (unsigned long)i,
							kvp_tier_name(tier), page);
						return -1;
					}
				}
			}
		}
	}
	return 0;
}

static int fail(const char *what, const struct kvp_error *e)
{
	printf("fail %s: %s: %s\n", what, kvp_code_name(e->code), e->message);
	fflush(stdout);
	return -1;
}

static int attach(struct engine *x)
{
	struct kvp_error e;

	x->c = kvp_client_connect(x->socket, "kvpool-system-engine", &e);
	if (!x->c)
		return fail("connect", &e);
	x->p = kvp_pool_attach(x->c, x->pool, NULL, &e);
	if (!x->p)
		return fail("attach", &e);
	kvp_pool_geometry(x->p, &x->g);
	x->ntokens = x->npages * x->g.page_tokens;
	x->tokens = malloc(sizeof(uint32_t) * x->ntokens);
	if (!x->tokens) {
		printf("fail out of memory\n");
		return -1;
	}
	for (uint32_t i = 0; i < x->ntokens; i++)
		x->tokens[i] = (uint32_t)(mix(x->seed * 1000003 + i) & 0x7fffffff);
	return 0;
}

/* The marker of the held lease's pages: the prefix's bytes of positions past its end. */
static int marker(struct engine *x, int fill, char *why, size_t whylen)
{
	uint32_t pt = x->g.page_tokens;

	return rows(x, KVP_TIER_DEVICE, x->lease_pages, x->ntokens, x->ntokens, x->ntokens + 2 * pt,
		    fill, why, whylen);
}

static int publish(struct engine *x)
{
	uint32_t *pages = malloc(sizeof(uint32_t) * x->npages);
	uint64_t lease, added = 0;
	struct kvp_error e;
	char why[256];
	int r = -1;

	if (!pages) {
		printf("fail out of memory\n");
		return -1;
	}
	if (kvp_lease_alloc(x->p, KVP_TIER_DEVICE, x->npages, &lease, pages, &e) < 0) {
		fail("lease", &e);
		goto out;
	}
	if (rows(x, KVP_TIER_DEVICE, pages, 0, 0, x->ntokens, 1, why, sizeof(why)) < 0) {
		printf("fail %s\n", why);
		goto out;
	}
	if (kvp_cache_insert(x->p, lease, 0, x->tokens, x->ntokens, 0, pages, x->npages, &added,
			     &e) < 0) {
		fail("insert", &e);
		goto out;
	}
	/* Pages of a prefix cached before (a second run with this seed) were freed: fine, the
	 * cached copy holds the same bytes. */
	kvp_lease_free(x->p, lease, NULL, 0, NULL);
	if (kvp_lease_alloc(x->p, KVP_TIER_DEVICE, 2, &x->lease, x->lease_pages, &e) < 0) {
		fail("lease (held)", &e);
		goto out;
	}
	marker(x, 1, why, sizeof(why));
	for (int t = 0; t < KVP_TIER_MAX; t++) {
		int fd = kvp_pool_tier_fd(x->p, t);

		x->base[t] = kvp_pool_tier_base(x->p, t);
		if (fd >= 0 && fstat(fd, &x->st[t]) < 0) {
			printf("fail fstat of the %s tier's fd: %s\n", kvp_tier_name(t),
			       strerror(errno));
			goto out;
		}
	}
	r = 0;
out:
	free(pages);
	return r;
}

/* After a failed call: notes its code in x->seen, waits a little and says whether to try
 * again (until end). */
static int again(struct engine *x, const struct kvp_error *e, uint64_t end)
{
	size_t l = strlen(x->seen);

	if (now_ms() >= end)
		return 0;
	snprintf(x->seen + l, sizeof(x->seen) - l, " %s", kvp_code_name(e->code));
	usleep(200 * 1000);
	return 1;
}

/* Matches the prefix (locked while it is read) and verifies every matched page; *matched:
 * the pages matched. retry: retry a failed match for up to retry_ms. */
static int match_verify(struct engine *x, uint32_t *matched, int retry)
{
	uint32_t cap = x->npages + 1, pt = x->g.page_tokens;
	uint32_t *dev = malloc(sizeof(uint32_t) * cap), *host = malloc(sizeof(uint32_t) * cap);
	struct kvp_match_result m = { .struct_size = sizeof(m) };
	uint64_t end = now_ms() + x->retry_ms;
	struct kvp_error e;
	char why[256];
	int r = -1;

	if (!dev || !host) {
		printf("fail out of memory\n");
		goto out;
	}
	while ((r = kvp_cache_match(x->p, 0, x->tokens, x->ntokens, 1, &m, dev, host, cap, &e)) <
		       0 &&
	       retry && again(x, &e, end))
		;
	if (r < 0) {
		printf("fail match: %s: %s%s%s\n", kvp_code_name(e.code), e.message,
		       x->seen[0] ? "; retried after:" : "", x->seen);
		goto out;
	}
	r = -1;
	if (rows(x, KVP_TIER_DEVICE, dev, 0, 0, m.n_device * pt, 0, why, sizeof(why)) < 0 ||
	    rows(x, KVP_TIER_HOST, host, m.n_device * pt, m.n_device * pt,
		 (m.n_device + m.n_host) * pt, 0, why, sizeof(why)) < 0) {
		printf("fail %s\n", why);
		goto out;
	}
	*matched = m.n_device + m.n_host;
	r = 0;
out:
	if (m.lock_id)
		kvp_cache_release(x->p, m.lock_id, NULL);
	free(dev);
	free(host);
	return r;
}

static int check(struct engine *x)
{
	struct kvp_error e;
	uint32_t matched = 0, extra;
	uint64_t end;
	char why[256];
	int r;

	x->seen[0] = 0;
	if (match_verify(x, &matched, 1) < 0)
		return -1;
	if (matched != x->npages) {
		printf("fail matched %u of %u pages%s%s\n", matched, x->npages,
		       x->seen[0] ? "; retried after:" : "", x->seen);
		return -1;
	}
	/* The lease is still ours: it grows by one page, and gives that page back. */
	end = now_ms() + x->retry_ms;
	while ((r = kvp_lease_extend(x->p, x->lease, 1, &extra, &e)) < 0 && again(x, &e, end))
		;
	if (r < 0)
		return fail("the held lease is not this session's (extend)", &e);
	if (kvp_lease_free(x->p, x->lease, &extra, 1, &e) != 2)
		return fail("the held lease is not this session's (free)", &e);
	if (marker(x, 0, why, sizeof(why)) < 0) {
		printf("fail held lease: %s\n", why);
		return -1;
	}
	for (int t = 0; t < KVP_TIER_MAX; t++) {
		int fd = kvp_pool_tier_fd(x->p, t);
		struct stat st;

		if (kvp_pool_tier_base(x->p, t) != x->base[t]) {
			printf("fail the %s tier is mapped at another address\n", kvp_tier_name(t));
			return -1;
		}
		if (fd >= 0 && (fstat(fd, &st) < 0 || st.st_ino != x->st[t].st_ino ||
				st.st_dev != x->st[t].st_dev)) {
			printf("fail the %s tier's fd is another file\n", kvp_tier_name(t));
			return -1;
		}
	}
	printf("ok session %lu matched %u pages, lease %lu held, mappings unchanged%s%s\n",
	       (unsigned long)kvp_client_session_id(x->c), matched, (unsigned long)x->lease,
	       x->seen[0] ? "; retried after:" : "", x->seen);
	fflush(stdout);
	return 0;
}

static int hold(struct engine *x)
{
	char line[64];

	if (publish(x) < 0)
		return 1;
	printf("ready session %lu pid %d pages %u lease %lu\n",
	       (unsigned long)kvp_client_session_id(x->c), (int)getpid(), x->npages,
	       (unsigned long)x->lease);
	fflush(stdout);
	while (fgets(line, sizeof(line), stdin)) {
		if (strcmp(line, "check\n") == 0)
			check(x);
		else if (strcmp(line, "quit\n") == 0)
			return 0;
		else
			printf("fail unknown command\n");
		fflush(stdout);
	}
	return 0;
}

static int verify(struct engine *x)
{
	uint32_t matched = 0;

	if (match_verify(x, &matched, 0) < 0)
		return 1;
	if (matched)
		printf("hit %u pages\n", matched);
	else
		printf("miss\n");
	return 0;
}

static void usage(FILE *f)
{
	fprintf(f, "Usage: kvpool-system-engine [--socket PATH] [--pool NAME] [--seed N] "
		   "[--pages N] [--retry-ms MS] hold|verify\n");
}

int main(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "socket", required_argument, NULL, 's' },
		{ "pool", required_argument, NULL, 'p' },
		{ "seed", required_argument, NULL, 'S' },
		{ "pages", required_argument, NULL, 'n' },
		{ "retry-ms", required_argument, NULL, 'r' },
		{ "help", no_argument, NULL, 'h' },
		{ 0 },
	};
	struct engine x = { .pool = "example", .seed = 1, .npages = 8, .retry_ms = 10000 };
	int o, rc;

	while ((o = getopt_long(argc, argv, "s:p:S:n:r:h", lo, NULL)) != -1) {
		switch (o) {
		case 's': x.socket = optarg; break;
		case 'p': x.pool = optarg; break;
		case 'S': x.seed = strtoull(optarg, NULL, 10); break;
		case 'n': x.npages = (uint32_t)strtoul(optarg, NULL, 10); break;
		case 'r': x.retry_ms = (uint32_t)strtoul(optarg, NULL, 10); break;
		case 'h': usage(stdout); return 0;
		default: usage(stderr); return 2;
		}
	}
	if (optind != argc - 1 || x.npages == 0 || x.npages > 4096) {
		usage(stderr);
		return 2;
	}
	if (attach(&x) < 0) {
		rc = 1;
	} else if (strcmp(argv[optind], "hold") == 0) {
		rc = hold(&x);
	} else if (strcmp(argv[optind], "verify") == 0) {
		rc = verify(&x);
	} else {
		usage(stderr);
		rc = 2;
	}
	free(x.tokens);
	kvp_client_close(x.c);
	return rc;
}
