/* reply.h - the reply arena: a Response under construction whose pieces (messages, strings,
 * page lists) come from an inline buffer first and malloc beyond it, all freed at once by
 * kvp_reply_release, plus the descriptors it carries. */
#pragma once
#include <stdbool.h>
#include <stddef.h>

#include "fail.h"
#include "kvpool.pb-c.h"

#define KVP_REPLY_MAX_FDS 4

/* Bytes of reply pieces held inside struct kvp_reply: the messages of every small reply. */
#define KVP_REPLY_INLINE 1024

/* A reply under construction: every allocation it makes is freed by kvp_reply_release. */
struct kvp_reply {
	Kvpool__Response resp;
	Kvpool__Status status;
	void **allocs;
	size_t nallocs, capallocs;
	int fds[KVP_REPLY_MAX_FDS]; /* borrowed (the pools own them): sent, never closed */
	int nfds;
	bool close_after; /* the connection ends once this reply is sent */
	/* kvp_reply_alloc serves small pieces from here, malloc only beyond it. A reply is
	 * never copied: pointers into it point here. Stays last (init does not clear it). */
	size_t inl_used;
	_Alignas(max_align_t) unsigned char inl[KVP_REPLY_INLINE];
};

void kvp_reply_init(struct kvp_reply *r, uint64_t id);
/* Frees every malloc'ed piece; the reply may be initialised again. */
void kvp_reply_release(struct kvp_reply *r);
/* Zeroed memory that lives as long as the reply; NULL on ENOMEM (or the "reply_alloc"
 * fault site). */
void *kvp_reply_alloc(struct kvp_reply *r, size_t n);
/* Hands malloc'ed p to the reply, freed with it. 0, or -ENOMEM with p already freed. */
int kvp_reply_adopt(struct kvp_reply *r, void *p);
/* A zeroed, initialised message of type desc owned by the reply; NULL on ENOMEM. */
void *kvp_reply_msg(struct kvp_reply *r, size_t size, const ProtobufCMessageDescriptor *desc);
#define KVP_REPLY_NEW(r, T, desc) ((T *)kvp_reply_msg((r), sizeof(T), &(desc)))
/* A copy of s owned by the reply; NULL on ENOMEM. */
char *kvp_reply_strdup(struct kvp_reply *r, const char *s);
/* Adds fd (borrowed) to the descriptors sent with the reply. Its index, or -ENOSPC. */
int kvp_reply_add_fd(struct kvp_reply *r, int fd);
/* Fills r->status from a typed failure. */
void kvp_reply_fail(struct kvp_reply *r, const struct kvp_fail *f);
/* A Geometry message for g owned by the reply; NULL on ENOMEM. */
Kvpool__Geometry *kvp_reply_geometry(struct kvp_reply *r, const struct kvp_geom *g);
