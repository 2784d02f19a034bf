/* admit.c - admission rules: descriptors, pre-Hello connections, per-uid and admin slots, the
 * buffer budget (admit.h). */
#include "admit.h"

#include <stdio.h>
#include <sys/resource.h>

uint64_t kvp_admit_raise_nofile(void)
{
	struct rlimit rl;

	if (getrlimit(RLIMIT_NOFILE, &rl) < 0)
		return 1024;
	if (rl.rlim_cur < rl.rlim_max) {
		struct rlimit up = { rl.rlim_max, rl.rlim_max };

		if (setrlimit(RLIMIT_NOFILE, &up) == 0)
			rl.rlim_cur = rl.rlim_max;
	}
	return rl.rlim_cur == RLIM_INFINITY ? UINT32_MAX : (uint64_t)rl.rlim_cur;
}

uint64_t kvp_admit_fd_reserve(uint64_t fd_limit)
{
	uint64_t r = fd_limit / 32 > 32 ? fd_limit / 32 : 32;

	return r > fd_limit / 2 ? fd_limit / 2 : r;
}

uint64_t kvp_admit_buffer_budget(const struct kvp_conf *c)
{
	uint64_t b = (uint64_t)c->max_sessions * KVP_BUDGET_PER_SESSION;

	if (c->buffer_budget)
		return c->buffer_budget;
	return b > KVP_BUDGET_MIN ? b : KVP_BUDGET_MIN;
}

/* Of a cap, what admins alone may use: admin_sessions, at most half the cap. */
static uint32_t kept(const struct kvp_conf *c, uint32_t cap)
{
	return c->admin_sessions < cap / 2 ? c->admin_sessions : cap / 2;
}

enum kvp_admit_refusal kvp_admit_connect(const struct kvp_conf *c, const struct kvp_admit_counts *n,
					 bool admin, uid_t uid, struct kvp_fail *f)
{
	uint64_t reserve = kvp_admit_fd_reserve(n->fd_limit);
	uint64_t fd_cap = n->fd_limit - (admin ? reserve / 2 : reserve);
	uint32_t pre_cap = c->max_prehello - (admin ? 0 : kept(c, c->max_prehello));

	/* The socket is open already; its pidfd is the one more it needs. */
	if (n->fds_used + KVP_CONN_FDS - 1 > fd_cap) {
		kvp_fail_limit(f, "fds", fd_cap);
		kvp_fail(f, KVP_ERR_LIMIT_EXCEEDED,
			 "kvpoold holds %lu of its %lu descriptors (%lu kept in reserve): no room "
			 "for another connection",
			 (unsigned long)n->fds_used, (unsigned long)n->fd_limit,
			 (unsigned long)(n->fd_limit - fd_cap));
		return KVP_ADMIT_FDS;
	}
	if (n->prehello >= pre_cap) {
		kvp_fail_limit(f, "pre-Hello connections", pre_cap);
		return KVP_ADMIT_PREHELLO;
	}
	if (!admin && c->max_sessions_per_uid && n->uid_conns >= c->max_sessions_per_uid) {
		char what[48];

		snprintf(what, sizeof(what), "connections of uid %u", (unsigned)uid);
		kvp_fail_limit(f, what, c->max_sessions_per_uid);
		return KVP_ADMIT_UID;
	}
	return KVP_ADMIT_OK;
}

enum kvp_admit_refusal kvp_admit_hello(const struct kvp_conf *c, const struct kvp_admit_counts *n,
				       bool admin, struct kvp_fail *f)
{
	uint32_t cap = c->max_sessions - (admin ? 0 : kept(c, c->max_sessions));

	if (n->sessions >= cap) {
		kvp_fail_limit(f, "sessions", cap);
		return KVP_ADMIT_SESSIONS;
	}
	return KVP_ADMIT_OK;
}

int kvp_admit_buffer(const struct kvp_conf *c, const struct kvp_admit_counts *n, uint64_t more,
		     struct kvp_fail *f)
{
	uint64_t budget = kvp_admit_buffer_budget(c);

	if (n->buf_bytes + more <= budget)
		return 0;
	kvp_fail_limit(f, "buffer bytes", budget);
	return kvp_fail(f, KVP_ERR_LIMIT_EXCEEDED,
			"kvpoold's buffers for clients hold %lu of their %lu-byte budget: %lu more "
			"do not fit",
			(unsigned long)n->buf_bytes, (unsigned long)budget, (unsigned long)more);
}
