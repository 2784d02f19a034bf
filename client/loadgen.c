/* loadgen.c - kvpool-loadgen: engine-like client processes against a running kvpoold.
 *
 * Workload "lease": each process keeps a batch of synthetic requests in flight: it leases
 * slots for a request, writes deterministic K/V bytes (a function of token id, position and
 * layer) straight into the shared pages, reads them back, and frees them. On OUT_OF_CAPACITY
 * it backs off and shrinks its batch, as an engine does. With --on-pressure it also asks kvpoold
 * for pressure notices and reacts before anything fails: below the watermark it halves its batch,
 * admits one request at a time and stops growing, until the recovery notice.
 *
 * Workload "shared-prefix": requests share system prompts (families) and grow as multi-turn
 * conversations. Each request matches the cache, verifies that every matched page holds
 * exactly the bytes its writer (any process) wrote for that prefix, after demotion and
 * promotion too, computes (writes) the rest, and inserts it. A mismatch is a failure exit. */
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "json.h"
#include "kvpool.h"

struct opts {
	const char *socket, *pool, *workload;
	int procs;
	double seconds;
	uint32_t min_tokens, max_tokens, batch;
	uint32_t families, prefix_tokens, turn_tokens, turns, conversations;
	int json;
	int private_pools; /* process i attaches pool "<pool><i>" */
	int on_pressure;   /* ask for pressure notices and shrink the batch under pressure */
};

/* Client-observed RPC latency: buckets growing by 1.25x from 1 us. */
#define LAT_BUCKETS 80

/* Per-process results, in shared memory so the parent sums them. */
struct result {
	uint64_t lat[LAT_BUCKETS];
	double t0;
	uint64_t requests, tokens, bytes_verified, mismatches;
	uint64_t errors[KVP_CODE_MAX];
	uint64_t hit_tokens, queried_tokens, loads, backoffs;
	uint64_t pressure_notices, pressure_waits; /* notices taken; admissions held back */
	uint64_t restarted_calls;		   /* calls retried after a kvpoold restart */
	int failed;
	char why[640];
};

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static unsigned lat_bucket(double us)
{
	unsigned b = 0;

	for (double edge = 1.0; us > edge && b < LAT_BUCKETS - 1; edge *= 1.25)
		b++;
	return b;
}

static double lat_edge(unsigned b)
{
	double edge = 1.0;

	while (b--)
		edge *= 1.25;
	return edge;
}

/* The latency (upper bucket edge, us) under which fraction q of the calls completed. */
static double lat_quantile(const uint64_t *lat, double q)
{
	uint64_t total = 0, seen = 0;

	for (unsigned b = 0; b < LAT_BUCKETS; b++)
		total += lat[b];
	for (unsigned b = 0; b < LAT_BUCKETS && total; b++) {
		seen += lat[b];
		if ((double)seen >= q * (double)total)
			return lat_edge(b);
	}
	return 0;
}

/* Times one library call into the process's histogram: TIMED(res, kvp_x(...)) evaluates to
 * the call's return (the comma operator orders start, call, stop). */
static void lat_start(struct result *res)
{
	res->t0 = now_s();
}

static int lat_stop(struct result *res, int r)
{
	res->lat[lat_bucket((now_s() - res->t0) * 1e6)]++;
	return r;
}

#define TIMED(res, call) (lat_start(res), lat_stop((res), (call)))
/* TIMED, and the call made again while it answers RESTARTED (kvpoold restarted during it and
 * the library resumed the session: the call is retried, as an engine would). */
#define CALL(x, call, e)                                                                           \
	__extension__({                                                                            \
		int r_;                                                                            \
		unsigned n_ = 0;                                                                   \
		while ((r_ = TIMED((x)->res, call)) < 0 && (e).code == KVP_E_RESTARTED &&          \
		       n_++ < 16)                                                                  \
			(x)->res->restarted_calls++;                                               \
		r_;                                                                                \
	})

static uint64_t mix(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ULL;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
	return x ^ (x >> 31);
}

/* The bytes of one row: a function of (key, layer, kv). key identifies the token: for the
 * lease workload (request seed, position, token id); for shared prefixes the hash of the whole
 * prefix up to and including the token, so equal prefixes have equal bytes. */
static void fill_row(uint8_t *dst, uint64_t n, uint64_t key, uint32_t layer, uint32_t kv)
{
	uint64_t s = mix(key ^ ((uint64_t)layer << 40) ^ ((uint64_t)kv << 56));

	for (uint64_t i = 0; i < n; i += 8) {
		uint64_t v = mix(s + i);

		memcpy(dst + i, &v, n - i < 8 ? n - i : 8);
	}
}

static int check_row(const uint8_t *src, uint64_t n, uint64_t key, uint32_t layer, uint32_t kv,
		     uint8_t *scratch)
{
	fill_row(scratch, n, key, layer, kv);
	return memcmp(src, scratch, n) == 0;
}

struct ctx {
	struct kvp_client *c;
	struct kvp_pool *p;
	struct kvp_geometry g;
	uint64_t row;
	uint8_t *scratch;
	struct result *res;
	const struct opts *o;
	unsigned seed;
	int pressured; /* the last notice for the device tier said: below the watermark */
};

/* Takes the pressure notices queued for x's client (never blocks). Returns 1 when one said the
 * device tier fell below its watermark since the last call, else 0. */
static int take_notices(struct ctx *x)
{
	uint8_t buf[512];
	struct kvp_event ev = { .struct_size = sizeof(ev),
				.payload = buf,
				.payload_cap = sizeof(buf) };
	struct kvp_pressure n = { .struct_size = sizeof(n) };
	struct kvp_error e;
	int fell = 0;

	if (!x->o->on_pressure)
		return 0;
	while (kvp_client_event_next(x->c, &ev, &e) == 0) {
		if (kvp_pressure_decode(&ev, &n, &e) < 0 || n.tier != KVP_TIER_DEVICE)
			continue;
		x->res->pressure_notices++;
		if (!n.recovered && !x->pressured)
			fell = 1;
		x->pressured = !n.recovered;
	}
	return fell;
}

/* Writes (or verifies) the rows of token positions [from, to) whose keys are keys[], held in
 * pages of tier (page i of pages[] holds positions [base + i*pt ...)). */
static int rows(struct ctx *x, int tier, const uint32_t *pages, uint32_t base, uint32_t from,
		uint32_t to, const uint64_t *keys, int verify)
{
	uint32_t pt = x->g.page_tokens;

	for (uint32_t pos = from; pos < to; pos++) {
		uint32_t page = pages[(pos - base) / pt], tok = (pos - base) % pt;

		for (uint32_t l = 0; l < x->g.layers; l++) {
			for (uint32_t kv = 0; kv < 2; kv++) {
				uint8_t *a = kvp_pool_slot_addr(x->p, tier, l, kv, page, tok);

				if (!a)
					return -1;
				if (!verify) {
					fill_row(a, x->row, keys[pos], l, kv);
				} else if (!check_row(a, x->row, keys[pos], l, kv, x->scratch)) {
					x->res->mismatches++;
					snprintf(
						x->res->why, sizeof(x->res->why),
						"byte mismatch at position %u layer %u %s (tier %s page %u)",
						pos, l, kv ? "V" : "K", kvp_tier_name(tier), page);
					return -1;
				} else {
					x->res->bytes_verified += x->row;
				}
			}
		}
	}
	return 0;
}

static void count_error(struct ctx *x, const struct kvp_error *e)
{
	if (e->code > 0 && e->code < KVP_CODE_MAX)
		x->res->errors[e->code]++;
}

/* ---- lease workload ---- */
struct req {
	uint64_t lease;
	uint32_t npages, ntokens;
	uint32_t *pages;
	uint64_t *keys;
};

static int lease_workload(struct ctx *x)
{
	const struct opts *o = x->o;
	uint32_t batch = o->batch, cap = o->max_tokens;
	struct req *reqs = calloc(o->batch, sizeof(*reqs));
	double end = now_s() + o->seconds;
	int rc = 0;

	if (!reqs)
		return -1;
	while (now_s() < end && rc == 0) {
		uint32_t n = 0;

		/* Admit a batch. */
		if (take_notices(x) && batch > 1)
			batch /= 2; /* the pool runs short: shrink before anything fails */
		for (; n < batch; n++) {
			struct req *r = &reqs[n];
			uint32_t span = cap > o->min_tokens ? cap - o->min_tokens + 1 : 1;
			struct kvp_error e;

			if (n && (take_notices(x), x->pressured)) {
				x->res->pressure_waits++; /* one request at a time while short */
				break;
			}

			r->ntokens = o->min_tokens + (uint32_t)rand_r(&x->seed) % span;
			r->npages = kvp_pool_pages_for(x->p, r->ntokens);
			r->pages = malloc(sizeof(uint32_t) * r->npages);
			r->keys = malloc(sizeof(uint64_t) * r->ntokens);
			if (!r->pages || !r->keys) {
				rc = -1;
				break;
			}
			if (CALL(x,
				 kvp_lease_alloc(x->p, KVP_TIER_DEVICE, r->npages, &r->lease,
						 r->pages, &e),
				 e) < 0) {
				count_error(x, &e);
				free(r->pages);
				free(r->keys);
				if (e.code != KVP_E_OUT_OF_CAPACITY &&
				    e.code != KVP_E_QUOTA_EXCEEDED) {
					snprintf(x->res->why, sizeof(x->res->why), "alloc: %s: %s",
						 kvp_code_name(e.code), e.message);
					rc = -1;
					break;
				}
				/* Back off and shrink, as an engine would. */
				x->res->backoffs++;
				if (batch > 1)
					batch = batch / 2;
				else if (cap > o->min_tokens)
					cap = cap / 2 > o->min_tokens ? cap / 2 : o->min_tokens;
				usleep(1000);
				break;
			}
			for (uint32_t i = 0; i < r->ntokens; i++)
				r->keys[i] = mix(((uint64_t)x->seed << 32) ^ r->lease ^
						 ((uint64_t)i << 20) ^ (uint64_t)rand_r(&x->seed));
			if (rows(x, KVP_TIER_DEVICE, r->pages, 0, 0, r->ntokens, r->keys, 0) < 0) {
				rc = -1;
				n++;
				break;
			}
		}
		/* Verify and finish the batch. */
		for (uint32_t i = 0; i < n; i++) {
			struct req *r = &reqs[i];
			struct kvp_error e;

			if (rc == 0 &&
			    rows(x, KVP_TIER_DEVICE, r->pages, 0, 0, r->ntokens, r->keys, 1) < 0)
				rc = -1;
			if (CALL(x, kvp_lease_free(x->p, r->lease, NULL, 0, &e), e) < 0) {
				count_error(x, &e);
				snprintf(x->res->why, sizeof(x->res->why), "free: %s", e.message);
				rc = -1;
			}
			x->res->requests++;
			x->res->tokens += r->ntokens;
			free(r->pages);
			free(r->keys);
		}
		if (batch < o->batch && n == batch && !x->pressured)
			batch++; /* pressure eased: grow back */
	}
	free(reqs);
	return rc;
}

/* ---- shared-prefix workload ---- */
static int prefix_request(struct ctx *x, const uint32_t *tok, const uint64_t *keys, uint32_t n)
{
	uint32_t pt = x->g.page_tokens, cap = n / pt + 1, matched, own_from, nlease;
	uint32_t *dev = malloc(sizeof(uint32_t) * cap), *host = malloc(sizeof(uint32_t) * cap);
	uint32_t *lease_pages = malloc(sizeof(uint32_t) * cap);
	struct kvp_match_result m = { .struct_size = sizeof(m) };
	struct kvp_error e;
	uint64_t lease = 0;
	int rc = -1;

	if (!dev || !host || !lease_pages)
		goto out;
	if (CALL(x, kvp_cache_match(x->p, 0, tok, n, 1, &m, dev, host, cap, &e), e) < 0) {
		count_error(x, &e);
		snprintf(x->res->why, sizeof(x->res->why), "match: %s", e.message);
		goto out;
	}
	matched = m.n_device + m.n_host;
	x->res->queried_tokens += n / pt * pt;
	x->res->hit_tokens += (uint64_t)matched * pt;
	if (m.n_host) {
		/* Promote the host continuation; the lock keeps the path while we read it. */
		int k = CALL(x, kvp_cache_load(x->p, m.lock_id, dev, cap, &e), e);

		if (k == (int)matched) {
			x->res->loads++;
		} else {
			count_error(x, &e);
			if (e.code != KVP_E_OUT_OF_CAPACITY && e.code != KVP_E_UNAVAILABLE) {
				snprintf(x->res->why, sizeof(x->res->why), "load: %s", e.message);
				goto out;
			}
			/* Device full of leases, or another engine reads the same host pages:
			 * verify them where they are. */
			if (rows(x, KVP_TIER_HOST, host, m.n_device * pt, m.n_device * pt,
				 matched * pt, keys, 1) < 0)
				goto out;
			matched = m.n_device;
		}
	}
	if (rows(x, KVP_TIER_DEVICE, dev, 0, 0, matched * pt, keys, 1) < 0)
		goto out;
	/* Compute the rest into leased pages and publish it. */
	own_from = matched * pt;
	nlease = n > own_from ? (n - own_from + pt - 1) / pt : 0;
	if (nlease) {
		if (CALL(x, kvp_lease_alloc(x->p, KVP_TIER_DEVICE, nlease, &lease, lease_pages, &e),
			 e) < 0) {
			count_error(x, &e);
			if (e.code == KVP_E_OUT_OF_CAPACITY) {
				x->res->backoffs++;
				usleep(1000);
				rc = 0;
			} else {
				snprintf(x->res->why, sizeof(x->res->why), "alloc: %s", e.message);
			}
			goto out;
		}
		if (rows(x, KVP_TIER_DEVICE, lease_pages, own_from, own_from, n, keys, 0) < 0)
			goto out;
		if (CALL(x,
			 kvp_cache_insert(x->p, lease, 0, tok, n, matched, lease_pages, nlease,
					  NULL, &e),
			 e) < 0) {
			count_error(x, &e);
			snprintf(x->res->why, sizeof(x->res->why), "insert: %s", e.message);
			goto out;
		}
		if (CALL(x, kvp_lease_free(x->p, lease, NULL, 0, &e), e) < 0) {
			count_error(x, &e);
			snprintf(x->res->why, sizeof(x->res->why), "free: %s", e.message);
			goto out;
		}
		lease = 0;
	}
	x->res->requests++;
	x->res->tokens += n;
	rc = 0;
out:
	if (lease)
		kvp_lease_free(x->p, lease, NULL, 0, NULL);
	if (m.lock_id && CALL(x, kvp_cache_release(x->p, m.lock_id, &e), e) < 0 && rc == 0) {
		snprintf(x->res->why, sizeof(x->res->why), "release: %s", e.message);
		rc = -1;
	}
	free(dev);
	free(host);
	free(lease_pages);
	return rc;
}

static int prefix_workload(struct ctx *x)
{
	const struct opts *o = x->o;
	uint32_t maxn = o->prefix_tokens + o->turns * o->turn_tokens;
	uint32_t *tok = malloc(sizeof(uint32_t) * maxn);
	uint64_t *keys = malloc(sizeof(uint64_t) * maxn);
	double end = now_s() + o->seconds;
	int rc = 0;

	if (!tok || !keys)
		return -1;
	while (rc == 0 && now_s() < end) {
		/* A conversation: a family's system prompt, then turns; each turn is a request
		 * over everything so far. Conversations repeat (ids from a small space) so that
		 * other processes hit them too. */
		uint32_t fam = (uint32_t)rand_r(&x->seed) % o->families;
		uint32_t conv = (uint32_t)rand_r(&x->seed) % o->conversations;
		uint32_t n = 0;
		uint64_t h = 0;

		for (uint32_t i = 0; i < o->prefix_tokens; i++, n++)
			tok[n] = 1000 + fam * 100000 + i;
		for (uint32_t t = 0; t < o->turns && rc == 0 && now_s() < end; t++) {
			for (uint32_t i = 0; i < o->turn_tokens; i++, n++)
				tok[n] = 5000000 + fam * 100000 + conv * 1000 + t * 37 + i;
			h = 0;
			for (uint32_t i = 0; i < n; i++) {
				h = mix(h ^ tok[i]);
				keys[i] = h;
			}
			rc = prefix_request(x, tok, keys, n);
		}
	}
	free(tok);
	free(keys);
	return rc;
}

static int child(const struct opts *o, int idx, struct result *res)
{
	struct kvp_error e;
	struct ctx x = { .o = o, .res = res, .seed = (unsigned)(idx * 7919 + getpid()) };
	char name[32];
	int rc;

	snprintf(name, sizeof(name), "loadgen-%d", idx);
	x.c = kvp_client_connect_opts(o->socket,
				      &(struct kvp_client_opts){
					      .struct_size = sizeof(struct kvp_client_opts),
					      .name = name,
					      .capabilities = KVP_CAP_ALL,
					      .flags = o->on_pressure ? KVP_CLIENT_F_PRESSURE : 0,
				      },
				      &e);
	if (!x.c) {
		snprintf(res->why, sizeof(res->why), "connect: %s", e.message);
		return 1;
	}
	{
		char pname[80];

		if (o->private_pools)
			snprintf(pname, sizeof(pname), "%s%d", o->pool, idx);
		else
			snprintf(pname, sizeof(pname), "%s", o->pool);
		x.p = kvp_pool_attach(x.c, pname, NULL, &e);
	}
	if (!x.p) {
		snprintf(res->why, sizeof(res->why), "attach %s: %s", o->pool, e.message);
		kvp_client_close(x.c);
		return 1;
	}
	kvp_pool_geometry(x.p, &x.g);
	x.row = kvp_pool_row_bytes(x.p);
	x.scratch = malloc(x.row + 8);
	if (!kvp_pool_tier_base(x.p, KVP_TIER_DEVICE) || !x.scratch) {
		snprintf(res->why, sizeof(res->why),
			 "pool %s has no device tier mapped in this process (backend %s)", o->pool,
			 kvp_backend_name(kvp_pool_tier_backend(x.p, KVP_TIER_DEVICE)));
		kvp_client_close(x.c);
		return 1;
	}
	rc = strcmp(o->workload, "shared-prefix") == 0 ? prefix_workload(&x) : lease_workload(&x);
	free(x.scratch);
	kvp_pool_detach(x.p, NULL);
	kvp_client_close(x.c);
	return rc == 0 && res->mismatches == 0 ? 0 : 1;
}

static void usage(FILE *f)
{
	fprintf(f,
		"Usage: kvpool-loadgen [OPTIONS]\n"
		"Engine-like client processes against kvpoold; exits 0 when every byte verified.\n\n"
		"  -s, --socket PATH       kvpoold socket (default: $KVPOOL_SOCKET or the default)\n"
		"  -p, --pool NAME         pool to attach (default: default)\n"
		"  -w, --workload W        lease (default) or shared-prefix\n"
		"  -n, --procs N           engine processes (default 4)\n"
		"  -t, --seconds S         duration (default 5)\n"
		"      --min-tokens N      smallest request (lease; default 16)\n"
		"      --max-tokens N      largest request (lease; default 2048)\n"
		"      --batch N           requests in flight per process (lease; default 8)\n"
		"      --families N        system prompt families (shared-prefix; default 4)\n"
		"      --prefix-tokens N   system prompt length (shared-prefix; default 512)\n"
		"      --turn-tokens N     tokens per turn (shared-prefix; default 64)\n"
		"      --turns N           turns per conversation (shared-prefix; default 6)\n"
		"      --conversations N   conversations per family (shared-prefix; default 8)\n"
		"      --private-pools     process i attaches pool NAME<i> (a private pool each,\n"
		"                          as in-process allocators do; for comparisons)\n"
		"      --on-pressure       ask for pressure notices; under pressure halve the batch\n"
		"                          and admit one request at a time (lease)\n"
		"      --json              print the summary as one JSON object\n");
}

int main(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "socket", required_argument, NULL, 's' },
		{ "pool", required_argument, NULL, 'p' },
		{ "workload", required_argument, NULL, 'w' },
		{ "procs", required_argument, NULL, 'n' },
		{ "seconds", required_argument, NULL, 't' },
		{ "min-tokens", required_argument, NULL, 1 },
		{ "max-tokens", required_argument, NULL, 2 },
		{ "batch", required_argument, NULL, 3 },
		{ "families", required_argument, NULL, 4 },
		{ "prefix-tokens", required_argument, NULL, 5 },
		{ "turn-tokens", required_argument, NULL, 6 },
		{ "turns", required_argument, NULL, 7 },
		{ "json", no_argument, NULL, 8 },
		{ "private-pools", no_argument, NULL, 9 },
		{ "conversations", required_argument, NULL, 10 },
		{ "on-pressure", no_argument, NULL, 11 },
		{ "help", no_argument, NULL, 'h' },
		{ 0 },
	};
	struct opts o = { .pool = "default",
			  .workload = "lease",
			  .procs = 4,
			  .seconds = 5,
			  .min_tokens = 16,
			  .max_tokens = 2048,
			  .batch = 8,
			  .families = 4,
			  .prefix_tokens = 512,
			  .turn_tokens = 64,
			  .turns = 6,
			  .conversations = 8 };
	struct result *res, sum = { 0 };
	double t0, wall;
	int c, failed = 0;

	while ((c = getopt_long(argc, argv, "s:p:w:n:t:h", lo, NULL)) != -1) {
		switch (c) {
		case 's': o.socket = optarg; break;
		case 'p': o.pool = optarg; break;
		case 'w': o.workload = optarg; break;
		case 'n': o.procs = atoi(optarg); break;
		case 't': o.seconds = atof(optarg); break;
		case 1: o.min_tokens = (uint32_t)atoi(optarg); break;
		case 2: o.max_tokens = (uint32_t)atoi(optarg); break;
		case 3: o.batch = (uint32_t)atoi(optarg); break;
		case 4: o.families = (uint32_t)atoi(optarg); break;
		case 5: o.prefix_tokens = (uint32_t)atoi(optarg); break;
		case 6: o.turn_tokens = (uint32_t)atoi(optarg); break;
		case 7: o.turns = (uint32_t)atoi(optarg); break;
		case 8: o.json = 1; break;
		case 9: o.private_pools = 1; break;
		case 10: o.conversations = (uint32_t)atoi(optarg); break;
		case 11: o.on_pressure = 1; break;
		case 'h': usage(stdout); return 0;
		default: usage(stderr); return 2;
		}
	}
	if (o.procs < 1 || o.procs > 256 || o.seconds <= 0 || o.seconds > 3600 || !o.min_tokens ||
	    o.max_tokens < o.min_tokens || !o.batch || !o.families || !o.turn_tokens || !o.turns ||
	    !o.conversations || o.conversations > 1000 ||
	    (strcmp(o.workload, "lease") && strcmp(o.workload, "shared-prefix"))) {
		fprintf(stderr, "kvpool-loadgen: bad arguments\n");
		usage(stderr);
		return 2;
	}
	res = mmap(NULL, sizeof(*res) * (size_t)o.procs, PROT_READ | PROT_WRITE,
		   MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (res == MAP_FAILED)
		return 1;
	memset(res, 0, sizeof(*res) * (size_t)o.procs);
	t0 = now_s();
	for (int i = 0; i < o.procs; i++) {
		pid_t pid = fork();

		if (pid == 0)
			_exit(child(&o, i, &res[i]));
		if (pid < 0) {
			perror("fork");
			return 1;
		}
	}
	for (int i = 0; i < o.procs; i++) {
		int st;

		if (wait(&st) > 0 && (!WIFEXITED(st) || WEXITSTATUS(st) != 0))
			failed++;
	}
	wall = now_s() - t0;
	for (int i = 0; i < o.procs; i++) {
		sum.requests += res[i].requests;
		sum.tokens += res[i].tokens;
		sum.bytes_verified += res[i].bytes_verified;
		sum.mismatches += res[i].mismatches;
		sum.hit_tokens += res[i].hit_tokens;
		sum.queried_tokens += res[i].queried_tokens;
		sum.loads += res[i].loads;
		sum.backoffs += res[i].backoffs;
		sum.pressure_notices += res[i].pressure_notices;
		sum.pressure_waits += res[i].pressure_waits;
		sum.restarted_calls += res[i].restarted_calls;
		for (int b = 0; b < LAT_BUCKETS; b++)
			sum.lat[b] += res[i].lat[b];
		for (int k = 0; k < KVP_CODE_MAX; k++)
			sum.errors[k] += res[i].errors[k];
		if (res[i].why[0])
			fprintf(stderr, "kvpool-loadgen: process %d: %s\n", i, res[i].why);
	}
	if (o.json) {
		printf("{\"workload\":");
		kvp_json_str(stdout, o.workload);
		printf(",\"procs\":%d,\"wall_s\":%.3f,\"requests\":%lu,"
		       "\"tokens\":%lu,\"requests_per_s\":%.1f,\"bytes_verified\":%lu,"
		       "\"mismatches\":%lu,\"hit_tokens\":%lu,\"queried_tokens\":%lu,\"loads\":%lu,"
		       "\"backoffs\":%lu,\"pressure_notices\":%lu,\"pressure_waits\":%lu,"
		       "\"restarted_calls\":%lu,\"rpc_p50_us\":%.1f,\"rpc_p99_us\":%.1f,\"errors\":{",
		       o.procs, wall, (unsigned long)sum.requests, (unsigned long)sum.tokens,
		       (double)sum.requests / wall, (unsigned long)sum.bytes_verified,
		       (unsigned long)sum.mismatches, (unsigned long)sum.hit_tokens,
		       (unsigned long)sum.queried_tokens, (unsigned long)sum.loads,
		       (unsigned long)sum.backoffs, (unsigned long)sum.pressure_notices,
		       (unsigned long)sum.pressure_waits, (unsigned long)sum.restarted_calls,
		       lat_quantile(sum.lat, 0.5), lat_quantile(sum.lat, 0.99));
		for (int k = 1, first = 1; k < KVP_CODE_MAX; k++) {
			if (!sum.errors[k])
				continue;
			printf("%s\"%s\":%lu", first ? "" : ",", kvp_code_name(k),
			       (unsigned long)sum.errors[k]);
			first = 0;
		}
		printf("},\"failed_procs\":%d}\n", failed);
	} else {
		printf("kvpool-loadgen: workload %s, %d processes, %.2f s\n", o.workload, o.procs,
		       wall);
		printf("  requests        %lu (%.1f/s)\n", (unsigned long)sum.requests,
		       (double)sum.requests / wall);
		printf("  tokens          %lu\n", (unsigned long)sum.tokens);
		printf("  bytes verified  %lu (%.1f MiB)\n", (unsigned long)sum.bytes_verified,
		       (double)sum.bytes_verified / 1048576.0);
		printf("  mismatches      %lu\n", (unsigned long)sum.mismatches);
		if (!strcmp(o.workload, "shared-prefix"))
			printf("  prefix hits     %lu of %lu tokens (%.1f%%), %lu loads (promotions)\n",
			       (unsigned long)sum.hit_tokens, (unsigned long)sum.queried_tokens,
			       sum.queried_tokens
				       ? 100.0 * (double)sum.hit_tokens / (double)sum.queried_tokens
				       : 0.0,
			       (unsigned long)sum.loads);
		printf("  back-offs       %lu\n", (unsigned long)sum.backoffs);
		if (sum.restarted_calls)
			printf("  restarts        %lu calls retried after a kvpoold restart\n",
			       (unsigned long)sum.restarted_calls);
		if (o.on_pressure)
			printf("  pressure        %lu notices, %lu admissions held back\n",
			       (unsigned long)sum.pressure_notices,
			       (unsigned long)sum.pressure_waits);
		printf("  rpc latency     p50 <= %.0f us, p99 <= %.0f us (client-observed)\n",
		       lat_quantile(sum.lat, 0.5), lat_quantile(sum.lat, 0.99));
		printf("  errors by code ");
		for (int k = 1, any = 0; k < KVP_CODE_MAX; k++) {
			if (sum.errors[k]) {
				printf(" %s=%lu", kvp_code_name(k), (unsigned long)sum.errors[k]);
				any = 1;
			}
			if (k == KVP_CODE_MAX - 1 && !any)
				printf(" none");
		}
		printf("\n  result          %s\n",
		       failed || sum.mismatches ? "FAILED" : "ok: every byte verified");
	}
	return failed || sum.mismatches ? 1 : 0;
}
