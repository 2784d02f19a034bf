/* fuzz_codec.c - libFuzzer target: frame.c's codec against protobuf-c on arbitrary bytes. Each
 * input is decoded as a Request (malloc and arena) and as a Response, by frame.c and by
 * protobuf_c_message_unpack: both must refuse it, or both give messages that protobuf-c packs to
 * the same bytes; and frame.c must pack every decoded message to protobuf-c's bytes. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "frame.h"
#include "msg_eq.h"

static struct kvp_arena g_arena;

static void same_pack(const ProtobufCMessage *ref, const ProtobufCMessage *got)
{
	size_t n1 = protobuf_c_message_get_packed_size(ref);
	size_t n2 = protobuf_c_message_get_packed_size(got);
	uint8_t *b1 = malloc(n1 + 1), *b2 = malloc(n2 + 1), *f;
	size_t flen;

	if (!b1 || !b2)
		abort();
	protobuf_c_message_pack(ref, b1);
	protobuf_c_message_pack(got, b2);
	if (n1 != n2 || memcmp(b1, b2, n1) || !h_msg_eq(ref, got)) {
		fprintf(stderr, "fuzz_codec: frame.c decoded another message than protobuf-c\n");
		abort();
	}
	/* frame.c's packer on the same message: protobuf-c's bytes after the frame header */
	if (kvp_frame_pack(got, &f, &flen) == 0) {
		if (flen != KVP_FRAME_HDR + n1 || memcmp(f + KVP_FRAME_HDR, b1, n1)) {
			fprintf(stderr, "fuzz_codec: frame.c packed other bytes than protobuf-c\n");
			abort();
		}
		free(f);
	}
	free(b1);
	free(b2);
}

static void check(const ProtobufCMessageDescriptor *d, ProtobufCMessage *got, const uint8_t *p,
		  size_t n)
{
	ProtobufCMessage *ref = protobuf_c_message_unpack(d, NULL, n, p);

	if ((ref == NULL) != (got == NULL)) {
		fprintf(stderr, "fuzz_codec: %s: protobuf-c %s, frame.c %s\n", d->name,
			ref ? "decodes" : "refuses", got ? "decodes" : "refuses");
		abort();
	}
	if (ref)
		same_pack(ref, got);
	if (ref)
		protobuf_c_message_free_unpacked(ref, NULL);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	ProtobufCMessage *m;

	if (size > KVP_FRAME_MAX)
		return 0;
	if (!g_arena.block && kvp_arena_init(&g_arena, 4096) < 0) /* small: big inputs spill */
		abort();
	/* A Request of more than KVP_FRAME_FIELDS_MAX fields is left unpacked or refused by
	 * design (frame.h; test_frame checks it): compared only where none can be. */
	if (size <= 2 * (size_t)KVP_FRAME_FIELDS_MAX) {
		m = (ProtobufCMessage *)kvp_frame_decode_request(data, (uint32_t)size);
		check(&kvpool__request__descriptor, m, data, size);
		if (m)
			protobuf_c_message_free_unpacked(m, NULL);
		m = (ProtobufCMessage *)kvp_frame_decode_request_in(&g_arena, data, (uint32_t)size);
		check(&kvpool__request__descriptor, m, data, size);
		kvp_arena_reset(&g_arena);
	}
	m = (ProtobufCMessage *)kvp_frame_decode_response(data, (uint32_t)size);
	check(&kvpool__response__descriptor, m, data, size);
	if (m)
		protobuf_c_message_free_unpacked(m, NULL);
	return 0;
}
