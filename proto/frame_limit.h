/* frame_limit.h - the bound on what one Request may make the decoder unpack (frame.h,
 * KVP_FRAME_FIELDS_MAX), counted on the wire before anything is allocated: frame.c's request
 * decoders ask here first. */
#pragma once
#include <stdint.h>

#include "kvpool.pb-c.h"

/* Reads a varint of at most max bytes at *p (< end). Returns 0 and advances *p (*v set), -1
 * otherwise (too long, or cut by end). */
int kvp_frame_varint(const uint8_t **p, const uint8_t *end, unsigned max, uint64_t *v);
/* Walks a Request payload at its top level, counting the fields of each call message (oneof
 * member) in it up to the bound. Returns 1 when one holds more (*id: the last id on the wire,
 * *call: that member's field number), -1 when the Request itself holds more fields than the
 * bound, 0 otherwise: also for a payload of at most twice the bound (not walked: a field takes
 * two bytes at least) and for bytes that are not well-formed (the decoders refuse them). */
int kvp_frame_limit_scan(const uint8_t *payload, uint32_t len, uint64_t *id, uint32_t *call);
/* The Request of a call left unpacked: id and case set, no member; allocated with a (NULL:
 * malloc). NULL when out of memory. */
ProtobufCMessage *kvp_frame_limit_stub(ProtobufCAllocator *a, uint64_t id, uint32_t call);
