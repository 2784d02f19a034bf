/* kvp_ring.h - the page reserve region one session shares with kvpoold (a memfd only they map),
 * and the rings of page ids in it. Shared by kvpoold and libkvpool; header only.
 *
 * Layout (every index a free-running uint32_t, slot = index & (slots - 1)):
 *   [0, 64)           struct kvp_resv_hdr
 *   per tier t, at kvp_resv_tier_off(slots, t):
 *     the fill ring   (kvpoold produces, the client consumes): reserve pages to lease
 *     the return ring (the client produces, kvpoold consumes): pages given back
 *   each ring: head on its own cache line, tail on the next, then the slots.
 *
 * The fill ring has two consumers: the client takes pages from it and kvpoold takes back what
 * the client has not taken (under memory pressure). Both advance its head by compare-and-swap
 * and read the slots before the swap; the producer (kvpoold) writes a slot only when the head
 * it last read says the slot is free, so a slot read is valid exactly when the swap from the
 * head read before it succeeds. The return ring is single producer, single consumer.
 *
 * kvpoold never trusts what the client wrote: it keeps its own copy of every index it owns and
 * of every id it put in the fill ring, and checks each index and id it reads against them and
 * the session's books. */
#ifndef KVP_RING_H
#define KVP_RING_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define KVP_RESV_MAGIC 0x7276706bu /* "kpvr" */
#define KVP_RESV_VERSION 1
#define KVP_RESV_MIN_SLOTS 64u
#define KVP_RESV_MAX_SLOTS 65536u
#define KVP_RESV_TIERS 2
#define KVP_RING_LINE 64

/* The watermarks: below KVP_RESV_LOW pages in its fill ring, or with KVP_RESV_HIGH pages
 * waiting in its return ring, a tier wants kvpoold: the client sends a Reserve call without
 * waiting for it, and kvpoold also looks by itself (when it serves the session's connection,
 * and every few milliseconds). */
#define KVP_RESV_LOW(granted) ((granted) / 2)
#define KVP_RESV_HIGH(slots) ((slots) / 4)

/* Header flags (kvpoold writes them). */
#define KVP_RESV_DEAD 1u /* the reserve ended (a bad ring, detach): use the RPC */

struct kvp_resv_hdr {
	uint32_t magic, version;
	uint32_t slots;			  /* per ring, a power of two */
	_Atomic uint32_t flags;		  /* KVP_RESV_* */
	_Atomic uint64_t kick_seq;	  /* the client: seq of its last Reserve call sent */
	_Atomic uint64_t served_seq;	  /* kvpoold: seq of the last Reserve call served */
	uint32_t granted[KVP_RESV_TIERS]; /* the reserve's size per tier (kvpoold) */
	/* kvpoold: which reserve of the session the region holds now (a region outlives its
	 * reserve and serves the session's next one); a client whose epoch differs uses the RPC */
	_Atomic uint32_t epoch;
	uint8_t pad_[20];
};
_Static_assert(sizeof(struct kvp_resv_hdr) == 64, "one cache line");

/* One ring as seen by one side. */
struct kvp_ring {
	_Atomic uint32_t *head, *tail;
	uint32_t *slot;
	uint32_t mask;
};

enum kvp_ring_dir { KVP_RING_FILL = 0, KVP_RING_RETURN = 1 };

static inline size_t kvp_ring_bytes(uint32_t slots)
{
	return 2 * KVP_RING_LINE + (size_t)slots * sizeof(uint32_t);
}

static inline size_t kvp_resv_tier_off(uint32_t slots, int tier)
{
	return sizeof(struct kvp_resv_hdr) + (size_t)tier * 2 * kvp_ring_bytes(slots);
}

/* Bytes of a region with rings of `slots` for every tier. */
static inline size_t kvp_resv_bytes(uint32_t slots)
{
	return kvp_resv_tier_off(slots, KVP_RESV_TIERS);
}

static inline bool kvp_resv_slots_ok(uint32_t slots)
{
	return slots >= KVP_RESV_MIN_SLOTS && slots <= KVP_RESV_MAX_SLOTS &&
	       (slots & (slots - 1)) == 0;
}

/* The ring of tier and direction in the region at base (of `bytes`, slots per ring). Returns
 * 0, or -1 when the region is too small or slots is not a valid count. */
static inline int kvp_ring_at(void *base, size_t bytes, uint32_t slots, int tier,
			      enum kvp_ring_dir dir, struct kvp_ring *r)
{
	char *p;

	if (!kvp_resv_slots_ok(slots) || tier < 0 || tier >= KVP_RESV_TIERS ||
	    bytes < kvp_resv_bytes(slots))
		return -1;
	p = (char *)base + kvp_resv_tier_off(slots, tier) + (size_t)dir * kvp_ring_bytes(slots);
	r->head = (_Atomic uint32_t *)p;
	r->tail = (_Atomic uint32_t *)(p + KVP_RING_LINE);
	r->slot = (uint32_t *)(p + 2 * KVP_RING_LINE);
	r->mask = slots - 1;
	return 0;
}

/* ---- the client's side ---- */

/* Entries waiting in r as the client sees them (0 when the indices make no sense). */
static inline uint32_t kvp_ring_count(const struct kvp_ring *r)
{
	uint32_t h = atomic_load_explicit(r->head, memory_order_acquire);
	uint32_t t = atomic_load_explicit(r->tail, memory_order_acquire);

	return t - h <= r->mask + 1 ? t - h : 0;
}

/* Takes n ids from the fill ring into out (a consumer that may race kvpoold's take-back).
 * Returns n, or 0 when fewer than n wait (out untouched then: ids read before a lost swap are
 * never used). */
static inline uint32_t kvp_ring_take(struct kvp_ring *r, uint32_t n, uint32_t *out)
{
	uint32_t h = atomic_load_explicit(r->head, memory_order_acquire);

	for (;;) {
		uint32_t t = atomic_load_explicit(r->tail, memory_order_acquire);

		if (t - h < n || t - h > r->mask + 1)
			return 0;
		for (uint32_t i = 0; i < n; i++)
			out[i] = r->slot[(h + i) & r->mask];
		if (atomic_compare_exchange_weak_explicit(r->head, &h, h + n, memory_order_acq_rel,
							  memory_order_acquire))
			return n;
	}
}

/* Puts n ids into the return ring (its only producer). *tail is the producer's own copy of
 * the tail. Returns n, or 0 when there is no room for all of them. */
static inline uint32_t kvp_ring_put(struct kvp_ring *r, uint32_t *tail, const uint32_t *ids,
				    uint32_t n)
{
	uint32_t h = atomic_load_explicit(r->head, memory_order_acquire), t = *tail;

	if (t - h > r->mask + 1 || r->mask + 1 - (t - h) < n)
		return 0;
	for (uint32_t i = 0; i < n; i++)
		r->slot[(t + i) & r->mask] = ids[i];
	*tail = t + n;
	atomic_store_explicit(r->tail, t + n, memory_order_release);
	return n;
}

/* ---- kvpoold's side: its indices are its own copies, what it reads is checked ---- */

/* Room in the fill ring for the producer whose tail is `tail` and who last saw head `seen`. */
static inline uint32_t kvp_ring_room(const struct kvp_ring *r, uint32_t tail, uint32_t seen)
{
	return r->mask + 1 - (tail - seen);
}

/* Writes n ids at the producer's tail and publishes it (room checked by the caller). */
static inline void kvp_ring_produce(struct kvp_ring *r, uint32_t *tail, const uint32_t *ids,
				    uint32_t n)
{
	for (uint32_t i = 0; i < n; i++)
		r->slot[(*tail + i) & r->mask] = ids[i];
	*tail += n;
	atomic_store_explicit(r->tail, *tail, memory_order_release);
}

/* The fill ring's head as the client left it, checked: it may only have moved forward from
 * `seen` up to `tail`. Returns 0 with *head, or -1 for a head the client corrupted. */
static inline int kvp_ring_head_seen(const struct kvp_ring *r, uint32_t seen, uint32_t tail,
				     uint32_t *head)
{
	uint32_t h = atomic_load_explicit(r->head, memory_order_acquire);

	if (h - seen > tail - seen)
		return -1;
	*head = h;
	return 0;
}

/* Takes back every id the client has not taken from the fill ring: swaps the head to `tail`.
 * Returns 0 with *from, the head the client had reached (ids [*from, tail) are taken back), or
 * -1 for a corrupt head. */
static inline int kvp_ring_take_back(struct kvp_ring *r, uint32_t seen, uint32_t tail,
				     uint32_t *from)
{
	uint32_t h = atomic_load_explicit(r->head, memory_order_acquire);

	for (;;) {
		if (h - seen > tail - seen)
			return -1;
		if (atomic_compare_exchange_strong_explicit(r->head, &h, tail, memory_order_acq_rel,
							    memory_order_acquire)) {
			*from = h;
			return 0;
		}
	}
}

/* The return ring's waiting ids, copied into out (room for mask + 1): the consumer's head is
 * `head`; the tail the client wrote is checked. Returns the count (the caller consumes them
 * with kvp_ring_consumed once checked), or -1 for a corrupt tail. */
static inline int64_t kvp_ring_peek(const struct kvp_ring *r, uint32_t head, uint32_t *out)
{
	uint32_t t = atomic_load_explicit(r->tail, memory_order_acquire), n = t - head;

	if (n > r->mask + 1)
		return -1;
	for (uint32_t i = 0; i < n; i++)
		out[i] = r->slot[(head + i) & r->mask];
	return n;
}

static inline void kvp_ring_consumed(struct kvp_ring *r, uint32_t *head, uint32_t n)
{
	*head += n;
	atomic_store_explicit(r->head, *head, memory_order_release);
}

#endif
