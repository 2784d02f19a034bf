/* events_encode.c - KVEventBatch in msgpack, byte for byte as vLLM's msgspec classes encode it
 * (vllm/distributed/kv_events.py): the batch an array [ts (float 64), [events], null], each event
 * a map whose first key "type" names its class (BlockStored, BlockRemoved, AllBlocksCleared),
 * then the class's fields without a default in declaration order, then the optional fields
 * kvpool sets (locality, ownership). Block hashes are bin (Python bytes). BlockStored's map has a
 * map 16 header, as msgspec writes a struct of more than 15 fields: the bytes are msgspec's. */
#include "events.h"

#include <errno.h>
#include <msgpack.h>
#include <stdlib.h>
#include <string.h>

static const char *const g_medium_names[KVP_EVENTS_MEDIUM_MAX] = {
	[KVP_EVENTS_GPU] = "GPU",
	[KVP_EVENTS_CPU] = "CPU",
	[KVP_EVENTS_STORAGE] = "STORAGE",
	[KVP_EVENTS_REMOTE] = "REMOTE",
};

const char *kvp_events_medium_name(enum kvp_events_medium m)
{
	return (unsigned)m < KVP_EVENTS_MEDIUM_MAX ? g_medium_names[m] : "?";
}

/* msgpack-c's writer into a batch: grows the body; a failed growth marks the batch (oom). */
struct sink {
	struct kvp_events_batch *b;
	bool oom;
};

static int sink_write(void *data, const char *buf, size_t len)
{
	struct sink *s = data;
	struct kvp_events_batch *b = s->b;

	if (s->oom)
		return -1;
	if (!len)
		return 0;
	if (b->len + len > b->cap) {
		size_t cap = b->cap ? b->cap : 4096;
		uint8_t *p;

		while (cap < b->len + len)
			cap *= 2;
		p = realloc(b->body, cap);
		if (!p) {
			s->oom = true;
			return -1;
		}
		b->body = p;
		b->cap = cap;
	}
	memcpy(b->body + b->len, buf, len);
	b->len += len;
	return 0;
}

static void pack_str(msgpack_packer *pk, const char *s)
{
	size_t n = strlen(s);

	msgpack_pack_str(pk, n);
	msgpack_pack_str_body(pk, s, n);
}

static void pack_bin(msgpack_packer *pk, const uint8_t *p, size_t n)
{
	msgpack_pack_bin(pk, n);
	msgpack_pack_bin_body(pk, p, n);
}

/* Ends an append: on a failed growth the batch goes back to where it was. */
static int append_end(struct kvp_events_batch *b, struct sink *s, size_t start)
{
	if (s->oom) {
		b->len = start;
		return -ENOMEM;
	}
	b->n++;
	return 0;
}

int kvp_events_batch_page(struct kvp_events_batch *b, const struct kvp_events_page *pg)
{
	struct sink s = { b, false };
	size_t start = b->len;
	const char *locality = pg->medium == KVP_EVENTS_REMOTE ? "REMOTE" : "LOCAL";
	msgpack_packer pk;

	if ((unsigned)pg->medium >= KVP_EVENTS_MEDIUM_MAX)
		return -EINVAL;
	msgpack_packer_init(&pk, &s, sink_write);
	if (pg->stored) {
		/* map 16 whatever the count, as msgspec writes a struct of more than 15 fields */
		uint8_t map16[3] = { 0xde, 0, (uint8_t)(9 + (b->source != NULL)) };

		sink_write(&s, (const char *)map16, sizeof(map16));
		pack_str(&pk, "type");
		pack_str(&pk, "BlockStored");
		pack_str(&pk, "block_hashes");
		msgpack_pack_array(&pk, 1);
		pack_bin(&pk, pg->key, pg->klen);
		pack_str(&pk, "parent_block_hash");
		if (pg->plen)
			pack_bin(&pk, pg->parent, pg->plen);
		else
			msgpack_pack_nil(&pk);
		pack_str(&pk, "token_ids");
		msgpack_pack_array(&pk, pg->ntokens);
		for (uint32_t i = 0; i < pg->ntokens; i++)
			msgpack_pack_uint32(&pk, pg->tokens[i]);
		pack_str(&pk, "block_size");
		msgpack_pack_uint32(&pk, pg->block_size);
		pack_str(&pk, "lora_id");
		msgpack_pack_nil(&pk);
		pack_str(&pk, "medium");
		pack_str(&pk, g_medium_names[pg->medium]);
		pack_str(&pk, "lora_name");
		msgpack_pack_nil(&pk);
	} else {
		msgpack_pack_map(&pk, 4 + (b->source != NULL));
		pack_str(&pk, "type");
		pack_str(&pk, "BlockRemoved");
		pack_str(&pk, "block_hashes");
		msgpack_pack_array(&pk, 1);
		pack_bin(&pk, pg->key, pg->klen);
		pack_str(&pk, "medium");
		pack_str(&pk, g_medium_names[pg->medium]);
	}
	pack_str(&pk, "locality");
	pack_str(&pk, locality);
	if (b->source) {
		pack_str(&pk, "ownership");
		pack_str(&pk, b->source);
	}
	return append_end(b, &s, start);
}

int kvp_events_batch_cleared(struct kvp_events_batch *b)
{
	struct sink s = { b, false };
	size_t start = b->len;
	msgpack_packer pk;

	msgpack_packer_init(&pk, &s, sink_write);
	msgpack_pack_map(&pk, 1);
	pack_str(&pk, "type");
	pack_str(&pk, "AllBlocksCleared");
	return append_end(b, &s, start);
}

int kvp_events_batch_encode(const struct kvp_events_batch *b, double ts, uint8_t **out,
			    size_t *outlen)
{
	struct kvp_events_batch head = { 0 };
	struct sink s = { &head, false };
	msgpack_packer pk;

	msgpack_packer_init(&pk, &s, sink_write);
	msgpack_pack_array(&pk, 3);
	msgpack_pack_double(&pk, ts);
	msgpack_pack_array(&pk, b->n);
	sink_write(&s, (const char *)b->body, b->len);
	msgpack_pack_nil(&pk); /* data_parallel_rank */
	if (s.oom) {
		free(head.body);
		return -ENOMEM;
	}
	*out = head.body;
	*outlen = head.len;
	return 0;
}

void kvp_events_batch_reset(struct kvp_events_batch *b)
{
	b->len = 0;
	b->n = 0;
}

void kvp_events_batch_free(struct kvp_events_batch *b)
{
	if (!b)
		return;
	free(b->body);
	b->body = NULL;
	b->len = b->cap = 0;
	b->n = 0;
}
