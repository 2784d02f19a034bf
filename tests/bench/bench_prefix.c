/* bench_prefix.c - prefix cache in-process (daemon/cache/prefix.c over daemon/alloc/pages.c):
 * insert and match on trees holding 1M and 10M cached tokens, page_tokens 16, shaped like
 * shared-prefix serving: a few hundred system prompts of 512..2048 tokens and conversations (1..4
 * turns of 64..512 tokens) branching off them. Only a device tier, big enough that nothing is
 * evicted, and a no-op copy callback.
 *
 * Rows, per tree size:
 *   match tokens/s (single thread, lock off, and lock + unlock) against memcmp of the same token
 *     bytes (query vs a copy of the cached sequence, matched length): the limit of reading them;
 *   insert tokens/s against memcmp of the already-cached part + memcpy of the new part;
 *   metadata bytes per cached page (kvp_index_stats().metadata_bytes / cached_pages) against
 *     the token ids alone (4 * page_tokens), and the same minus the token ids against 64 B. */
#include <errno.h>

#include "bench.h"
#include "pages.h"
#include "index.h"

#define PT 16
#define VOCAB 151936u
#define MAX_TURN_TOKENS 512
#define TAIL 100 /* unaligned, uncached next-turn tokens appended to every query */

struct conv {
	uint32_t prompt;
	uint32_t own; /* tokens after the prompt, whole pages */
	uint64_t seed;
};

struct shape {
	uint32_t nprompts;
	uint32_t *plen;
	uint32_t **ptok;
	struct conv *convs;
	uint32_t nconvs, cap;
};

static uint64_t rng(uint64_t *s)
{
	uint64_t x = *s;

	x ^= x << 13;
	x ^= x >> 7;
	x ^= x << 17;
	return *s = x;
}

static int noop_copy(void *ctx, enum kvp_copy_dir dir, const uint32_t *src, const uint32_t *dst,
		     uint32_t n)
{
	(void)ctx, (void)dir, (void)src, (void)dst, (void)n;
	return 0;
}

/* Writes the conversation's tokens (prompt + own) to out; returns the count. */
static uint32_t conv_tokens(const struct shape *sh, const struct conv *c, uint32_t *out)
{
	uint32_t n = sh->plen[c->prompt];
	uint64_t s = c->seed;

	memcpy(out, sh->ptok[c->prompt], sizeof(uint32_t) * n);
	for (uint32_t i = 0; i < c->own; i++)
		out[n + i] = (uint32_t)(rng(&s) % VOCAB);
	return n + c->own;
}

static void shape_prompts(struct shape *sh, uint32_t nprompts, uint64_t *s)
{
	sh->nprompts = nprompts;
	sh->plen = malloc(sizeof(uint32_t) * nprompts);
	sh->ptok = malloc(sizeof(uint32_t *) * nprompts);
	if (!sh->plen || !sh->ptok)
		B_DIE("out of memory");
	for (uint32_t p = 0; p < nprompts; p++) {
		sh->plen[p] = (512 + (uint32_t)(rng(s) % (2048 - 512 + 1))) / PT * PT;
		sh->ptok[p] = malloc(sizeof(uint32_t) * sh->plen[p]);
		if (!sh->ptok[p])
			B_DIE("out of memory");
		for (uint32_t i = 0; i < sh->plen[p]; i++)
			sh->ptok[p][i] = (uint32_t)(rng(s) % VOCAB);
	}
}

static void add_conv(struct shape *sh, uint64_t *s)
{
	struct conv c;
	uint32_t turns = 1 + (uint32_t)(rng(s) % 4);

	if (sh->nconvs == sh->cap) {
		sh->cap = sh->cap ? sh->cap * 2 : 1024;
		sh->convs = realloc(sh->convs, sizeof(*sh->convs) * sh->cap);
		if (!sh->convs)
			B_DIE("out of memory");
	}
	c.prompt = (uint32_t)(rng(s) % sh->nprompts);
	c.own = 0;
	for (uint32_t t = 0; t < turns; t++)
		c.own += (64 + (uint32_t)(rng(s) % (MAX_TURN_TOKENS - 64 + 1))) / PT * PT;
	c.seed = rng(s) | 1;
	sh->convs[sh->nconvs++] = c;
}

static void run(uint64_t target_tokens, int quick)
{
	struct shape sh = { 0 };
	uint64_t s = 0x9e3779b97f4a7c15ull ^ target_tokens;
	uint32_t nprompts = 300;
	uint32_t pool_pages = (uint32_t)(target_tokens / PT + 2 * 4096 + 4096);
	struct kvp_pages *dev = kvp_pages_new(pool_pages);
	struct kvp_index_conf conf = {
		.page_tokens = PT, .policy = KVP_EVICT_POLICY_LRU, .dev = dev, .copy = noop_copy
	};
	struct kvp_index *pfx;
	struct kvp_index_stats st;
	uint32_t maxseq = 2048 + 4 * MAX_TURN_TOKENS + TAIL;
	uint32_t *seq = malloc(sizeof(uint32_t) * maxseq), *ref = malloc(sizeof(uint32_t) * maxseq);
	uint32_t *pages = malloc(sizeof(uint32_t) * maxseq),
		 *dup = malloc(sizeof(uint32_t) * maxseq);
	uint32_t *dups = malloc(sizeof(uint32_t) * maxseq);
	uint32_t *dst = malloc(sizeof(uint32_t) * maxseq);
	uint32_t *mdev = malloc(sizeof(uint32_t) * maxseq),
		 *mhost = malloc(sizeof(uint32_t) * maxseq);
	uint32_t *dupcount;
	uint64_t cached = 0, ins_tokens = 0, ins_ns = 0, base_ns = 0;
	const char *tag = target_tokens >= 10000000 ? "10M" : "1M";

	if (!dev || !seq || !ref || !pages || !dup || !dups || !dst || !mdev || !mhost)
		B_DIE("out of memory");
	pfx = kvp_index_new(&conf);
	if (!pfx)
		B_DIE("kvp_prefix_new failed");
	shape_prompts(&sh, nprompts, &s);

	/* Build: insert whole conversations until the tree holds target_tokens. */
	while (cached < target_tokens) {
		struct kvp_index_insert_result res;
		struct conv *c;
		uint32_t n, np;
		uint64_t t0;
		int rc;

		add_conv(&sh, &s);
		c = &sh.convs[sh.nconvs - 1];
		n = conv_tokens(&sh, c, seq);
		np = n / PT;
		if (kvp_pages_alloc(dev, np, pages) < 0)
			B_DIE("device tier too small: %u pages", pool_pages);
		t0 = b_now_ns();
		rc = kvp_index_insert_tokens(pfx, 0, seq, np, KVP_TIER_ID_DEVICE, pages, &res, dup);
		ins_ns += b_now_ns() - t0;
		if (rc < 0)
			B_DIE("kvp_prefix_insert: %d", rc);
		ins_tokens += (uint64_t)np * PT;
		for (uint32_t i = 0; i < res.dup_pages; i++)
			dups[i] = pages[dup[i]];
		if (res.dup_pages && kvp_pages_release(dev, dups, res.dup_pages) < 0)
			B_DIE("release of duplicate pages failed");
		cached += (uint64_t)res.new_pages * PT;
	}
	kvp_index_stats(pfx, &st);
	if (!quick && kvp_index_check(pfx) < 0)
		B_DIE("kvp_prefix_check failed after the build");

	/* Insert baseline: replay the same sequences; memcmp the part that was already cached
	 * (vs a copy), memcpy the new part. The dup split is recomputed the way the tree saw it:
	 * the longest common whole-page prefix with the conversations before, i.e. the prompt
	 * for every conversation but the first one on that prompt. */
	dupcount = calloc(sh.nprompts, sizeof(uint32_t));
	if (!dupcount)
		B_DIE("out of memory");
	for (uint32_t i = 0; i < sh.nconvs; i++) {
		const struct conv *c = &sh.convs[i];
		uint32_t n = conv_tokens(&sh, c, seq),
			 known = dupcount[c->prompt]++ ? sh.plen[c->prompt] : 0;
		uint64_t t0;

		memcpy(ref, seq, sizeof(uint32_t) * known);
		t0 = b_now_ns();
		if (memcmp(seq, ref, sizeof(uint32_t) * known) != 0)
			B_DIE("baseline mismatch");
		memcpy(dst, seq + known, sizeof(uint32_t) * (n - known));
		b_use(dst);
		base_ns += b_now_ns() - t0;
	}
	free(dupcount);

	b_row_print(&(struct b_row){
		.name = b_fmt("prefix.insert.%s", tag),
		.params = b_fmt("{\"cached_tokens\":%lu,\"page_tokens\":%u,\"system_prompts\":%u,"
				"\"conversations\":%u,\"entries\":%lu,\"inserted_tokens\":%lu}",
				(unsigned long)st.cached_pages[KVP_TIER_ID_DEVICE] * PT, PT,
				sh.nprompts, sh.nconvs, (unsigned long)st.entries,
				(unsigned long)ins_tokens),
		.baseline_what =
			"memcmp of the already-cached tokens + memcpy of the new ones (tokens/s)",
		.baseline = (double)ins_tokens / ((double)base_ns / 1e9),
		.have_base = 1,
		.value = (double)ins_tokens / ((double)ins_ns / 1e9),
		.have_value = 1,
		.unit = "tokens/s",
		.target = "none",
		.note = "tree built from empty by these inserts" });

	/* Match: queries are cached conversations plus an uncached, unaligned next turn. */
	{
		uint32_t nq = quick ? 1024 : 8192, reps = quick ? 5 : 7;
		uint32_t *qoff = malloc(sizeof(uint32_t) * (nq + 1)),
			 *qmatch = calloc(nq, sizeof(uint32_t));
		uint32_t *qbuf, *rbuf;
		uint64_t total = 0, matched = 0;
		double best_k = 0, best_kl = 0, best_m = 0;

		if (!qoff || !qmatch)
			B_DIE("out of memory");
		uint32_t *qconv = malloc(sizeof(uint32_t) * nq);

		if (!qconv)
			B_DIE("out of memory");
		qoff[0] = 0;
		for (uint32_t i = 0; i < nq; i++) {
			const struct conv *c;

			qconv[i] = (uint32_t)(rng(&s) % sh.nconvs);
			c = &sh.convs[qconv[i]];
			qoff[i + 1] = qoff[i] + sh.plen[c->prompt] + c->own + TAIL;
		}
		qbuf = malloc(sizeof(uint32_t) * qoff[nq]);
		rbuf = malloc(sizeof(uint32_t) * qoff[nq]);
		if (!qbuf || !rbuf)
			B_DIE("out of memory");
		for (uint32_t i = 0; i < nq; i++) {
			const struct conv *c = &sh.convs[qconv[i]];
			uint32_t n = conv_tokens(&sh, c, qbuf + qoff[i]);

			qoff[i + 1] = qoff[i] + n + TAIL;
			for (uint32_t k = 0; k < TAIL; k++)
				qbuf[qoff[i] + n + k] = VOCAB + k; /* never cached */
		}
		memcpy(rbuf, qbuf, sizeof(uint32_t) * qoff[nq]);
		total = qoff[nq];
		for (uint32_t r = 0; r < reps; r++) {
			uint64_t t0, t1, mt = 0;

			/* kvpool, no lock */
			t0 = b_now_ns();
			for (uint32_t i = 0; i < nq; i++) {
				struct kvp_index_match m;

				if (kvp_index_match_tokens(pfx, 0, qbuf + qoff[i],
							   qoff[i + 1] - qoff[i], 0, &m, mdev,
							   mhost) < 0)
					B_DIE("kvp_prefix_match failed");
				qmatch[i] = m.dev_pages * PT;
				mt += qmatch[i];
			}
			t1 = b_now_ns();
			matched = mt;
			if ((double)mt / ((double)(t1 - t0) / 1e9) > best_k)
				best_k = (double)mt / ((double)(t1 - t0) / 1e9);

			/* kvpool, lock + unlock (what the daemon does for kvp_cache_match with
			 * lock) */
			t0 = b_now_ns();
			for (uint32_t i = 0; i < nq; i++) {
				struct kvp_index_match m;

				if (kvp_index_match_tokens(pfx, 0, qbuf + qoff[i],
							   qoff[i + 1] - qoff[i], 1, &m, mdev,
							   mhost) < 0)
					B_DIE("kvp_prefix_match (lock) failed");
				kvp_index_unlock(pfx, m.lock);
			}
			t1 = b_now_ns();
			if ((double)mt / ((double)(t1 - t0) / 1e9) > best_kl)
				best_kl = (double)mt / ((double)(t1 - t0) / 1e9);

			/* baseline: memcmp of the matched token bytes against a copy */
			t0 = b_now_ns();
			for (uint32_t i = 0; i < nq; i++)
				if (memcmp(qbuf + qoff[i], rbuf + qoff[i],
					   sizeof(uint32_t) * qmatch[i]))
					B_DIE("baseline mismatch");
			t1 = b_now_ns();
			if ((double)mt / ((double)(t1 - t0) / 1e9) > best_m)
				best_m = (double)mt / ((double)(t1 - t0) / 1e9);
		}
		if (matched + (uint64_t)nq * TAIL != total)
			B_DIE("match found %lu of %lu cached tokens", (unsigned long)matched,
			      (unsigned long)(total - (uint64_t)nq * TAIL));
		for (int lock = 0; lock < 2; lock++)
			b_row_print(&(struct b_row){
				.name = b_fmt("prefix.match%s.%s", lock ? "_lock" : "", tag),
				.params = b_fmt(
					"{\"cached_tokens\":%lu,\"page_tokens\":%u,\"queries\":%u,"
					"\"avg_query_tokens\":%.0f,\"uncached_tail\":%u,"
					"\"threads\":1,\"lock\":%s,\"best_of\":%u}",
					(unsigned long)st.cached_pages[KVP_TIER_ID_DEVICE] * PT, PT,
					nq, (double)total / nq, TAIL, lock ? "true" : "false",
					reps),
				.baseline_what =
					"memcmp of the same matched token bytes (tokens/s)",
				.baseline = best_m,
				.have_base = 1,
				.value = lock ? best_kl : best_k,
				.have_value = 1,
				.unit = "tokens/s",
				.target = "value >= 1e8 tokens/s" });
		free(qconv);
		free(qoff);
		free(qmatch);
		free(qbuf);
		free(rbuf);
	}

	{
		uint64_t cp = st.cached_pages[KVP_TIER_ID_DEVICE];
		/* a token page keeps its tokens and its 32-byte page key (the slab slot) */
		double own = 4.0 * PT + KVP_PAGE_KEY_BYTES;
		double bpp = cp ? (double)(st.metadata_bytes + st.key_bytes) / (double)cp : 0;
		const char *prm =
			b_fmt("{\"cached_tokens\":%lu,\"page_tokens\":%u,\"entries\":%lu,"
			      "\"metadata_bytes\":%lu,\"slab_bytes\":%lu}",
			      (unsigned long)cp * PT, PT, (unsigned long)st.entries,
			      (unsigned long)st.metadata_bytes, (unsigned long)st.key_bytes);

		b_row_print(&(struct b_row){
			.name = b_fmt("prefix.metadata_per_page.%s", tag),
			.params = prm,
			.baseline_what =
				"token ids and page key alone: 4 * page_tokens + 32 (bytes/page)",
			.baseline = own,
			.have_base = 1,
			.value = bpp,
			.have_value = cp > 0,
			.unit = "bytes/page",
			.target = "value <= 64 + 4 * page_tokens + 32" });
		b_row_print(&(struct b_row){
			.name = b_fmt("prefix.metadata_overhead_per_page.%s", tag),
			.params = prm,
			.baseline_what = "the 64 B budget (bytes/page)",
			.baseline = 64,
			.have_base = 1,
			.value = bpp - own,
			.have_value = cp > 0,
			.unit = "bytes/page",
			.target = "ratio <= 1",
			.note = "index bytes per cached page (entries, table, slabs with their spare "
				"capacity) minus the token ids and page key" });
	}
	kvp_index_free(pfx);
	kvp_pages_free(dev);
	for (uint32_t p = 0; p < sh.nprompts; p++)
		free(sh.ptok[p]);
	free(sh.ptok);
	free(sh.plen);
	free(sh.convs);
	free(seq);
	free(ref);
	free(pages);
	free(dup);
	free(dups);
	free(dst);
	free(mdev);
	free(mhost);
}

int main(int argc, char **argv)
{
	int quick = b_quick(argc, argv);

	run(1000000, quick);
	if (!quick)
		run(10000000, quick);
	return 0;
}
