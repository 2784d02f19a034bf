/* defer.c - deferred-reply tickets (defer.h). */
#include "defer.h"
#include "reply.h"

#include <stdlib.h>

struct kvp_defer *kvp_defer_take(struct kvp_defers *ds, uint64_t session_id, uint32_t uid,
				 uint64_t req_id, int call_case, struct kvp_fail *f)
{
	uint32_t max = ds->max ? ds->max : KVP_DEFER_MAX;
	uint32_t per = ds->per_session ? ds->per_session : KVP_DEFER_PER_SESSION;
	uint32_t per_uid = ds->per_uid ? ds->per_uid : max / 4 > per ? max / 4 : per;
	struct kvp_defer *t;

	if (ds->n >= max) {
		kvp_fail_limit(f, "pending_replies", max);
		return NULL;
	}
	if (kvp_defer_count(ds, session_id) >= per) {
		kvp_fail_limit(f, "session_pending_replies", per);
		return NULL;
	}
	if (kvp_defer_count_uid(ds, uid) >= per_uid) {
		kvp_fail_limit(f, "uid_pending_replies", per_uid);
		return NULL;
	}
	t = calloc(1, sizeof(*t));
	if (!t) {
		kvp_fail(f, KVP_ERR_INTERNAL, "kvpoold is out of memory");
		return NULL;
	}
	t->session_id = session_id;
	t->uid = uid;
	t->req_id = req_id;
	t->call_case = call_case;
	clock_gettime(CLOCK_MONOTONIC, &t->started);
	t->all_next = ds->all;
	if (ds->all)
		ds->all->all_prev = t;
	ds->all = t;
	ds->n++;
	return t;
}

uint32_t kvp_defer_count(const struct kvp_defers *ds, uint64_t session_id)
{
	uint32_t n = 0;

	for (const struct kvp_defer *t = ds->all; t; t = t->all_next)
		n += t->session_id == session_id;
	return n;
}

uint32_t kvp_defer_count_uid(const struct kvp_defers *ds, uint32_t uid)
{
	uint32_t n = 0;

	for (const struct kvp_defer *t = ds->all; t; t = t->all_next)
		n += t->uid == uid;
	return n;
}

static void defer_free(struct kvp_defers *ds, struct kvp_defer *t)
{
	if (t->all_prev)
		t->all_prev->all_next = t->all_next;
	else
		ds->all = t->all_next;
	if (t->all_next)
		t->all_next->all_prev = t->all_prev;
	ds->n--;
	free(t);
}

void kvp_defer_drop(struct kvp_defers *ds, struct kvp_defer *t)
{
	defer_free(ds, t);
}

void kvp_defer_answer(struct kvp_defers *ds, struct kvp_defer *t, struct kvp_reply *r, int code)
{
	if (ds->deliver && ds->deliver(ds->ctx, t, r, code))
		ds->answered++;
	else
		ds->dropped++;
	defer_free(ds, t);
}

void kvp_defer_fail(struct kvp_defers *ds, struct kvp_defer *t, const struct kvp_fail *f)
{
	struct kvp_reply r;

	kvp_reply_init(&r, t->req_id);
	kvp_reply_fail(&r, f);
	kvp_defer_answer(ds, t, &r, (int)f->code);
	kvp_reply_release(&r);
}
