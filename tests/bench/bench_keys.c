/* bench_keys.c - hash-keyed match in-process: 1M cached pages (chains of 64 keys of 32 bytes, as
 * engines' SHA-256 page hashes), every chain matched once in random order, single thread, keys
 * per second; baseline: a plain open-addressing hash-set lookup of the same keys in the same run
 * (keys inline in the table, linear probing, one memcmp per probe, no prefetching). A second row
 * matches the same keys inserted one by one in random order (no chain sits in consecutive
 * entries: every key goes through the table); a third gives the metadata bytes per page. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "index.h"
#include "pages.h"

#define KEY_BYTES 32
#define CHAIN 64

static uint64_t g_rng = 0x9e3779b97f4a7c15ULL;

static uint64_t rnd(void)
{
	g_rng ^= g_rng << 13;
	g_rng ^= g_rng >> 7;
	g_rng ^= g_rng << 17;
	return g_rng;
}

static uint64_t set_hash(const uint8_t *k)
{
	uint64_t h = 0x243f6a8885a308d3ULL;

	for (int i = 0; i < KEY_BYTES; i += 8) {
		uint64_t v;

		memcpy(&v, k + i, 8);
		h = (h ^ (v * 0x87c37b91114253d5ULL)) * 0x4cf5ad432745937fULL;
		h ^= h >> 29;
	}
	return h;
}

/* The baseline: a hash set of the keys, KEY_BYTES inline per slot, load factor <= 1/2. */
struct set {
	uint8_t *slots;
	uint8_t *used;
	uint64_t mask;
};

static void set_add(struct set *s, const uint8_t *k)
{
	uint64_t i = set_hash(k) & s->mask;

	while (s->used[i])
		i = (i + 1) & s->mask;
	s->used[i] = 1;
	memcpy(s->slots + i * KEY_BYTES, k, KEY_BYTES);
}

static int set_has(const struct set *s, const uint8_t *k)
{
	for (uint64_t i = set_hash(k) & s->mask; s->used[i]; i = (i + 1) & s->mask)
		if (!memcmp(s->slots + i * KEY_BYTES, k, KEY_BYTES))
			return 1;
	return 0;
}

static int noop_copy(void *ctx, enum kvp_copy_dir dir, const uint32_t *src, const uint32_t *dst,
		     uint32_t n)
{
	(void)ctx, (void)dir, (void)src, (void)dst, (void)n;
	return 0;
}

/* The same keys, each inserted alone in a random order, then every chain matched. */
static int scattered(const struct kvp_key *keys, uint32_t npages, const uint32_t *order,
		     uint32_t nchains, double base)
{
	struct kvp_pages *host = kvp_pages_new(npages);
	struct kvp_index *kc = kvp_index_new(&(struct kvp_index_conf){
		NULL, host, noop_copy, NULL, NULL, 0, KVP_EVICT_POLICY_LRU, false });
	uint32_t *perm = malloc((size_t)npages * sizeof(*perm)), dev[CHAIN];
	uint64_t hits = 0;
	double t0, t;

	if (!host || !kc || !perm)
		return -1;
	for (uint32_t i = 0; i < npages; i++)
		perm[i] = i;
	for (uint32_t i = npages - 1; i > 0; i--) {
		uint32_t j = (uint32_t)(rnd() % (i + 1)), x = perm[i];

		perm[i] = perm[j];
		perm[j] = x;
	}
	for (uint32_t i = 0; i < npages; i++) {
		uint32_t pg;

		if (kvp_pages_alloc(host, 1, &pg) < 0 ||
		    kvp_index_insert(kc, 7, &keys[perm[i]], 1, 0, KVP_TIER_ID_HOST, &pg, NULL,
				     NULL) < 0)
			return -1;
	}
	t0 = b_now_s();
	for (uint32_t c = 0; c < nchains; c++) {
		struct kvp_index_match m;

		kvp_index_match(kc, 7, keys + (size_t)order[c] * CHAIN, CHAIN, 0, &m, NULL, dev);
		hits += m.dev_pages + m.host_pages;
	}
	t = b_now_s() - t0;
	if (hits != npages)
		return -1;
	b_row_print(&(struct b_row){
		.name = "keys_match_1M_scattered",
		.params = b_fmt("{\"cached_pages\":%u,\"chain\":%d,\"key_bytes\":%d}", npages,
				CHAIN, KEY_BYTES),
		.baseline_what = "plain open-addressing hash-set lookup of the same keys, keys/s",
		.baseline = base,
		.have_base = 1,
		.value = npages / t,
		.have_value = 1,
		.unit = "keys/s",
		.target = "none (the table path alone; the 20M target is keys_match_1M's)",
		.note = "keys inserted one per call in random order: every lookup hashes and probes",
	});
	kvp_index_free(kc);
	kvp_pages_free(host);
	free(perm);
	return 0;
}

int main(int argc, char **argv)
{
	uint32_t npages = b_quick(argc, argv) ? 65536 : 1u << 20, nchains = npages / CHAIN;
	uint8_t *kb = malloc((size_t)npages * KEY_BYTES);
	struct kvp_key *keys = malloc((size_t)npages * sizeof(*keys));
	uint32_t *order = malloc((size_t)nchains * sizeof(*order)), pages[CHAIN], dev[CHAIN];
	struct kvp_pages *host = kvp_pages_new(npages);
	struct kvp_index *kc = kvp_index_new(&(struct kvp_index_conf){
		NULL, host, noop_copy, NULL, NULL, 0, KVP_EVICT_POLICY_LRU, false });
	struct set set;
	uint64_t hits = 0, bhits = 0, slots = 1;
	double t0, t_kc, t_set, bpp;
	struct kvp_index_stats st;

	if (!kb || !keys || !order || !host || !kc) {
		fprintf(stderr, "bench_keys: out of memory\n");
		return 1;
	}
	for (size_t i = 0; i < (size_t)npages * KEY_BYTES; i += 8) {
		uint64_t v = rnd();

		memcpy(kb + i, &v, 8);
	}
	for (uint32_t i = 0; i < npages; i++)
		keys[i] = (struct kvp_key){ KEY_BYTES, kb + (size_t)i * KEY_BYTES };
	for (uint32_t c = 0; c < nchains; c++) {
		struct kvp_index_insert_result r;

		if (kvp_pages_alloc(host, CHAIN, pages) < 0 ||
		    kvp_index_insert(kc, 7, keys + (size_t)c * CHAIN, CHAIN, 0, KVP_TIER_ID_HOST,
				     pages, &r, NULL) < 0 ||
		    r.new_pages != CHAIN) {
			fprintf(stderr, "bench_keys: insert failed\n");
			return 1;
		}
		order[c] = c;
	}
	for (uint32_t c = nchains - 1; c > 0; c--) {
		uint32_t j = (uint32_t)(rnd() % (c + 1)), t = order[c];

		order[c] = order[j];
		order[j] = t;
	}
	while (slots < (uint64_t)npages * 2)
		slots *= 2;
	set.slots = malloc(slots * KEY_BYTES);
	set.used = calloc(slots, 1);
	set.mask = slots - 1;
	if (!set.slots || !set.used)
		return 1;
	for (uint32_t i = 0; i < npages; i++)
		set_add(&set, keys[i].data);

	t0 = b_now_s();
	for (uint32_t c = 0; c < nchains; c++) {
		struct kvp_index_match m;

		kvp_index_match(kc, 7, keys + (size_t)order[c] * CHAIN, CHAIN, 0, &m, NULL, dev);
		hits += m.dev_pages + m.host_pages;
	}
	t_kc = b_now_s() - t0;
	t0 = b_now_s();
	for (uint32_t c = 0; c < nchains; c++)
		for (uint32_t i = 0; i < CHAIN; i++)
			bhits += (uint64_t)set_has(&set, keys[(size_t)order[c] * CHAIN + i].data);
	t_set = b_now_s() - t0;
	b_use(&bhits);
	if (hits != npages || bhits != npages || kvp_index_check(kc) < 0) {
		fprintf(stderr, "bench_keys: %lu / %lu hits of %u, or books wrong\n",
			(unsigned long)hits, (unsigned long)bhits, npages);
		return 1;
	}
	kvp_index_stats(kc, &st);
	bpp = kvp_index_bytes_per_page(kc);

	b_row_print(&(struct b_row){
		.name = "keys_match_1M",
		.params = b_fmt("{\"cached_pages\":%u,\"chain\":%d,\"key_bytes\":%d}", npages,
				CHAIN, KEY_BYTES),
		.baseline_what = "plain open-addressing hash-set lookup of the same keys, keys/s",
		.baseline = npages / t_set,
		.have_base = 1,
		.value = npages / t_kc,
		.have_value = 1,
		.unit = "keys/s",
		.target = ">= 20M keys/s",
		.note = "single thread, every chain matched once in random order (no lock)",
	});
	b_row_print(&(struct b_row){
		.name = "keys_metadata_per_page",
		.params = b_fmt("{\"cached_pages\":%u,\"key_bytes\":%d}", npages, KEY_BYTES),
		.baseline_what =
			"bytes per slot of the baseline hash set (key inline, 1 used byte, "
			"load 1/2)",
		.baseline = (double)slots * (KEY_BYTES + 1) / npages,
		.have_base = 1,
		.value = bpp,
		.have_value = 1,
		.unit = "bytes/page (entry + table share, key slab apart)",
		.target = "<= 64 B plus the key bytes",
		.note = b_fmt(
			"key slabs %.1f B/page; all metadata incl. spare capacity %.1f B/page",
			(double)st.key_bytes / npages, (double)st.metadata_bytes / npages),
	});
	kvp_index_free(kc);
	kvp_pages_free(host);
	if (scattered(keys, npages, order, nchains, npages / t_set) < 0) {
		fprintf(stderr, "bench_keys: the scattered run failed\n");
		return 1;
	}
	free(set.slots);
	free(set.used);
	free(kb);
	free(keys);
	free(order);
	return 0;
}
