/* reload.c - budget check, pool creation and the two-half reload (reload.h). */
#include "reload.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "budget.h"
#include "defer.h"
#include "log.h"
#include "reply.h"
#include "units.h"
#include "session.h"
#include "snapshot.h"

int kvp_daemon_check_budget(const struct kvp_conf *c)
{
	struct kvp_budget_verdict v;
	char line[512];
	int r = kvp_budget_check(c, kvp_budget_env_system(), &v);

	if (r == -ENOMEM) {
		kvp_budget_format(&v, line, sizeof(line));
		log_err("%s: HOST_BUDGET_EXCEEDED", line);
		return r;
	}
	if (r == -ENODEV) {
		log_err("pool %s: NUMA node %d does not exist on this machine", v.pool,
			v.numa_node);
		return -EINVAL;
	}
	if (r < 0) {
		log_err("budget check: cannot read this machine's memory limits: %s", strerror(-r));
		return r;
	}
	if (v.warning[0])
		log_warn("%s", v.warning);
	return 0;
}

struct kvpd_pool *kvp_daemon_create_pool(const struct kvp_pool_conf *pc, uint32_t id, char *why,
					 size_t whylen)
{
	struct kvp_fail f = { 0 };
	struct kvpd_pool *p = kvp_pool_create(pc, id, &f);
	char dev[32], host[32];

	if (!p) {
		log_err("pool %s: %s", pc->name, f.msg);
		if (why)
			snprintf(why, whylen, "%s", f.msg);
		return NULL;
	}
	kvp_units_bytes(p->mem[KVP_TIER_ID_DEVICE].bytes, dev, sizeof(dev));
	kvp_units_bytes(p->mem[KVP_TIER_ID_HOST].bytes, host, sizeof(host));
	log_notice("pool %s: %u layers x %u kv heads x %u dim %s, %u tokens/page, "
		   "%lu B/token; device %s %lu pages (%s, NUMA %d), host %lu pages "
		   "(%s, NUMA %d%s%s)%s%s",
		   pc->name, pc->layers, pc->kv_heads, pc->head_dim, kvp_conf_dtype_name(pc->dtype),
		   pc->page_tokens, (unsigned long)kvp_conf_token_bytes(pc),
		   kvp_pool_has_tier(p, KVP_TIER_ID_DEVICE) ? kvp_device_kind_name(pc->device)
							    : "none",
		   (unsigned long)(kvp_pool_has_tier(p, KVP_TIER_ID_DEVICE) ? pc->device_pages : 0),
		   dev, p->mem[KVP_TIER_ID_DEVICE].numa_node, (unsigned long)pc->host_pages, host,
		   p->mem[KVP_TIER_ID_HOST].numa_node,
		   p->mem[KVP_TIER_ID_HOST].locked ? ", locked" : "",
		   p->mem[KVP_TIER_ID_HOST].huge ? ", huge pages" : "", p->note[0] ? ": " : "",
		   p->note);
	return p;
}

static bool same_pool_shape(const struct kvp_pool_conf *a, const struct kvp_pool_conf *b)
{
	return a->layers == b->layers && a->kv_heads == b->kv_heads && a->head_dim == b->head_dim &&
	       a->page_tokens == b->page_tokens && a->dtype == b->dtype && a->device == b->device &&
	       a->cuda_device == b->cuda_device && a->device_pages == b->device_pages &&
	       a->host_pages == b->host_pages && a->numa_node == b->numa_node &&
	       a->hugepages == b->hugepages && a->mlock == b->mlock && a->eviction == b->eviction &&
	       a->disk == b->disk && a->disk_pages == b->disk_pages &&
	       strcmp(a->disk_path, b->disk_path) == 0;
}

#define RELOAD_LINES 24
#define RELOAD_LINE 160

/* What a reload did, as its callers are told: code OK with the changes made and the parts
 * refused, or a failure (nothing changed) with its reason. */
struct reload_result {
	enum kvp_err code;
	char err[384];
	char line[2][RELOAD_LINES][RELOAD_LINE]; /* [0] changes, [1] refused */
	uint32_t n[2];
};

static void note(struct reload_result *res, int refused, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static void note(struct reload_result *res, int refused, const char *fmt, ...)
{
	va_list ap;

	if (res->n[refused] >= RELOAD_LINES)
		return;
	va_start(ap, fmt);
	vsnprintf(res->line[refused][res->n[refused]++], RELOAD_LINE, fmt, ap);
	va_end(ap);
}

static void refuse(struct reload_result *res, enum kvp_err code, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static void refuse(struct reload_result *res, enum kvp_err code, const char *fmt, ...)
{
	va_list ap;

	res->code = code;
	va_start(ap, fmt);
	vsnprintf(res->err, sizeof(res->err), fmt, ap);
	va_end(ap);
}

/* One Reload call's answer: the result, or its failure. */
static void answer_one(struct kvp_defers *ds, struct kvp_defer *t, const struct reload_result *res)
{
	struct kvp_reply r;
	struct kvp_fail f;
	Kvpool__ReloadResp *m;

	kvp_fail_init(&f);
	if (res->code != KVP_ERR_NONE) {
		kvp_fail(&f, res->code, "reload refused, the running config is kept: %s", res->err);
		kvp_defer_fail(ds, t, &f);
		return;
	}
	kvp_reply_init(&r, t->req_id);
	m = KVP_REPLY_NEW(&r, Kvpool__ReloadResp, kvpool__reload_resp__descriptor);
	for (int k = 0; m && k < 2; k++) {
		char **v = res->n[k] ? kvp_reply_alloc(&r, sizeof(char *) * res->n[k]) : NULL;

		if (res->n[k] && !v) {
			m = NULL;
			break;
		}
		for (uint32_t i = 0; i < res->n[k]; i++) {
			v[i] = kvp_reply_strdup(&r, res->line[k][i]);
			if (!v[i]) {
				m = NULL;
				break;
			}
		}
		if (k) {
			m->n_refused = res->n[k];
			m->refused = v;
		} else if (m) {
			m->n_changes = res->n[k];
			m->changes = v;
		}
	}
	if (!m) {
		kvp_reply_release(&r);
		kvp_fail(&f, KVP_ERR_INTERNAL,
			 "the reload was done, but kvpoold ran out of memory for its answer");
		kvp_defer_fail(ds, t, &f);
		return;
	}
	r.resp.result_case = KVPOOL__RESPONSE__RESULT_RELOAD;
	r.resp.reload = m;
	kvp_defer_answer(ds, t, &r, 0);
	kvp_reply_release(&r);
}

/* Answers every ticket of list with res. */
static void answer(struct kvp_defers *ds, struct kvp_defer *list, const struct reload_result *res)
{
	while (list) {
		struct kvp_defer *t = list;

		list = t->next;
		answer_one(ds, t, res);
	}
}

struct reload_job {
	struct kvp_job job;
	struct kvp_daemon *d;
	void (*finished)(void *ctx);
	void *ctx;
	char path[4096];
	struct kvp_conf cur;  /* the running configuration when the reload began */
	struct kvp_conf next; /* the file's */
	bool refused;	      /* logged; nothing to apply */
	bool not_created;     /* a new pool could not be created: refused, res lists why */
	struct kvpd_pool *pools[KVP_MAX_POOLS]; /* created here for next.pools[cur.n_pools..] */
	uint32_t n_new;				/* how many of them were created */
	struct kvp_defer *waiters;		/* the Reload calls this reload answers */
	struct reload_result res;
};

/* KVPOOLD_RELOAD_DELAY_MS (tests): the worker sleeps that long before creating pools, so a test
 * can show the loop serving while a reload is slow. */
static void test_delay(void)
{
	const char *v = getenv("KVPOOLD_RELOAD_DELAY_MS");
	long ms = v ? strtol(v, NULL, 10) : 0;

	if (ms > 0) {
		struct timespec ts = { .tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L };

		log_warn("reload: delayed %ld ms (KVPOOLD_RELOAD_DELAY_MS)", ms);
		while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
			;
	}
}

/* Whether next may replace cur: every running pool is still there, unchanged and in its
 * place. Logs the refusal. */
static bool compatible(const struct kvp_conf *cur, const struct kvp_conf *next,
		       struct reload_result *res)
{
	for (uint32_t i = 0; i < cur->n_pools; i++) {
		const struct kvp_pool_conf *c = &cur->pools[i];
		bool found = false;

		for (uint32_t j = 0; j < next->n_pools; j++) {
			if (strcmp(next->pools[j].name, c->name))
				continue;
			found = true;
			if (!same_pool_shape(c, &next->pools[j]) || j != i) {
				log_err("reload refused, keeping the running config: pool %s changes "
					"size, geometry or place; restart kvpoold for that",
					c->name);
				refuse(res, KVP_ERR_INVALID_ARGUMENT,
				       "pool %s changes size, geometry or place; restart kvpoold "
				       "for that",
				       c->name);
				return false;
			}
		}
		if (!found) {
			log_err("reload refused, keeping the running config: pool %s was removed; "
				"restart kvpoold for that",
				c->name);
			refuse(res, KVP_ERR_INVALID_ARGUMENT,
			       "pool %s was removed; restart kvpoold for that", c->name);
			return false;
		}
	}
	/* After the pools: a removed or moved pool is named as such. */
	if (!kvp_conf_events_same(cur, next)) {
		log_err("reload refused, keeping the running config: the [events] section or a "
			"pool's events key changes; restart kvpoold for that");
		refuse(res, KVP_ERR_INVALID_ARGUMENT,
		       "the [events] section or a pool's events key changes; restart kvpoold for "
		       "that");
		return false;
	}
	if (!kvp_conf_remote_same(cur, next)) {
		log_err("reload refused, keeping the running config: the [remote] section or a "
			"pool's remote mode changes; restart kvpoold for that");
		refuse(res, KVP_ERR_INVALID_ARGUMENT,
		       "the [remote] section or a pool's remote mode changes; restart kvpoold for "
		       "that");
		return false;
	}
	return true;
}

/* The new pools alone: the running pools' memory exists already and the machine's free
 * memory (and locked-memory room) no longer includes it, so counting it again would refuse a
 * reload that fits. */
static int check_new_pools(const struct kvp_conf *cur, const struct kvp_conf *next)
{
	struct kvp_conf *added;
	int r;

	if (next->n_pools <= cur->n_pools)
		return 0;
	added = malloc(sizeof(*added));
	if (!added)
		return -ENOMEM;
	*added = *next;
	memmove(added->pools, next->pools + cur->n_pools,
		sizeof(added->pools[0]) * (next->n_pools - cur->n_pools));
	added->n_pools = next->n_pools - cur->n_pools;
	r = kvp_daemon_check_budget(added);
	free(added);
	return r;
}

static void reload_run(struct kvp_job *job)
{
	struct reload_job *j = (struct reload_job *)job;
	char err[512];

	int r;

	if (kvp_conf_load_file(&j->next, j->path, err, sizeof(err)) < 0) {
		log_err("reload refused, keeping the running config: %s", err);
		refuse(&j->res, KVP_ERR_INVALID_ARGUMENT, "%s", err);
		j->refused = true;
		return;
	}
	if (!compatible(&j->cur, &j->next, &j->res)) {
		j->refused = true;
		return;
	}
	r = check_new_pools(&j->cur, &j->next);
	if (r < 0) {
		log_err("reload refused, keeping the running config: new pools do not fit");
		refuse(&j->res,
		       r == -ENOMEM   ? KVP_ERR_HOST_BUDGET_EXCEEDED
		       : r == -EINVAL ? KVP_ERR_INVALID_ARGUMENT
				      : KVP_ERR_INTERNAL,
		       "the new pools do not fit this machine (kvpoold's log says why)");
		j->refused = true;
		return;
	}
	/* The disks of the whole new file: a new pool's region must not overlap a running
	 * pool's, and must fit its device or filesystem (the running pools' files are counted as
	 * the room they hold already). */
	if (j->next.n_pools > j->cur.n_pools &&
	    kvp_budget_disk_check(&j->next, err, sizeof(err)) < 0) {
		log_err("reload refused, keeping the running config: disk budget: %s", err);
		refuse(&j->res, KVP_ERR_INVALID_ARGUMENT, "the new pools' disks do not fit: %s",
		       err);
		j->refused = true;
		return;
	}
	if (j->next.n_pools > j->cur.n_pools)
		test_delay();
	for (uint32_t i = j->cur.n_pools; i < j->next.n_pools; i++) {
		char why[256] = "";
		struct kvpd_pool *p =
			kvp_daemon_create_pool(&j->next.pools[i], i, why, sizeof(why));

		if (!p) {
			/* All or nothing: the pools made so far go (reload_done destroys them), and
			 * nothing of the file is applied. */
			note(&j->res, 1, "pool %s: cannot be created: %s", j->next.pools[i].name,
			     why);
			for (uint32_t k = i + 1; k < j->next.n_pools; k++)
				note(&j->res, 1, "pool %s: not tried", j->next.pools[k].name);
			j->refused = j->not_created = true;
			return;
		}
		if (kvp_snap_attach(p) < 0)
			log_warn("pool %s: no books for restarts", p->conf.name);
		j->pools[j->n_new++] = p;
	}
}

/* The changes the file makes to the running configuration, as notes in res (logged when
 * applied: dry false). */
static void describe(const struct kvp_daemon *d, struct reload_job *j, bool dry)
{
	struct reload_result *res = &j->res;
	const struct kvp_conf *n = &j->next;

	for (uint32_t i = 0; i < d->n_pools; i++) {
		if (d->conf.pools[i].session_quota_tokens != n->pools[i].session_quota_tokens) {
			if (!dry)
				log_notice("reload: pool %s session quota %lu -> %lu tokens",
					   n->pools[i].name,
					   (unsigned long)d->conf.pools[i].session_quota_tokens,
					   (unsigned long)n->pools[i].session_quota_tokens);
			note(res, 0, "pool %s: session quota %lu -> %lu tokens", n->pools[i].name,
			     (unsigned long)d->conf.pools[i].session_quota_tokens,
			     (unsigned long)n->pools[i].session_quota_tokens);
		}
	}
	if (d->conf.log_level != n->log_level)
		note(res, 0, "log level %d -> %d", d->conf.log_level, n->log_level);
	if (d->conf.keepalive_ms != n->keepalive_ms)
		note(res, 0, "keep-alive %lu -> %lu ms", (unsigned long)d->conf.keepalive_ms,
		     (unsigned long)n->keepalive_ms);
	if (dry)
		for (uint32_t i = d->n_pools; i < n->n_pools; i++)
			note(res, 0, "pool %s: would be created (%lu device pages, %lu host pages)",
			     n->pools[i].name, (unsigned long)n->pools[i].device_pages,
			     (unsigned long)n->pools[i].host_pages);
}

/* On the loop thread: the quotas, access lists, log level, keep-alive and limits of the file
 * take effect, and the new pools join. */
static void apply(struct kvp_daemon *d, struct reload_job *j)
{
	struct reload_result *res = &j->res;
	const struct kvp_conf *n = &j->next;
	uint32_t old_pools = d->n_pools;
	struct kvp_pool_conf keep[KVP_MAX_POOLS];

	describe(d, j, false);
	for (uint32_t i = 0; i < old_pools; i++)
		kvp_pool_conf_copy_access(&d->pools[i]->conf, &n->pools[i]);
	memcpy(keep, d->conf.pools, sizeof(keep));
	d->conf = *n;
	memcpy(d->conf.pools, keep, sizeof(keep[0]) * old_pools);
	for (uint32_t i = 0; i < old_pools; i++)
		kvp_pool_conf_copy_access(&d->conf.pools[i], &n->pools[i]);
	d->conf.n_pools = old_pools;
	g_log_level = n->log_level;
	for (uint32_t k = 0; k < j->n_new; k++) {
		uint32_t i = old_pools + k;

		d->conf.pools[i] = n->pools[i];
		d->pools[i] = j->pools[k];
		j->pools[k] = NULL;
		d->conf.n_pools = d->n_pools = i + 1;
		note(res, 0, "pool %s: created (%lu device pages, %lu host pages)",
		     n->pools[i].name, (unsigned long)n->pools[i].device_pages,
		     (unsigned long)n->pools[i].host_pages);
	}
	kvp_daemon_recheck_sessions(d);
	log_notice("reload: done (%u pools)", d->n_pools);
}

static void reload_done(struct kvp_job *job, bool cancelled)
{
	struct reload_job *j = (struct reload_job *)job;
	struct kvp_daemon *d = j->d;

	if (cancelled) {
		log_notice("reload: dropped, kvpoold is stopping");
		refuse(&j->res, KVP_ERR_SHUTTING_DOWN, "kvpoold is stopping");
	} else if (j->not_created) {
		/* What the file would change is listed with what was refused; the log says both. */
		describe(d, j, true);
		for (uint32_t i = 0; i < j->res.n[1]; i++)
			log_err("reload refused, nothing applied: %s", j->res.line[1][i]);
		for (uint32_t i = 0; i < j->res.n[0]; i++)
			log_notice("reload: not applied: %s", j->res.line[0][i]);
	} else if (!j->refused) {
		/* Only a reload changes the pools, and one runs at a time: d is as it was copied.
		 */
		if (d->n_pools != j->cur.n_pools) {
			log_err("reload refused: the pools changed while it ran");
			refuse(&j->res, KVP_ERR_INTERNAL, "the pools changed while it ran");
		} else {
			apply(d, j);
		}
	}
	answer(&d->defers, j->waiters, &j->res);
	for (uint32_t k = 0; k < j->n_new; k++)
		kvp_pool_destroy(j->pools[k]);
	if (j->finished)
		j->finished(j->ctx);
	free(j);
}

int kvp_reload_start(struct kvp_daemon *d, struct kvp_work *w, void (*finished)(void *ctx),
		     void *ctx)
{
	struct kvp_defer *waiters = d->defers.reload_waiting;
	struct reload_result res;
	struct reload_job *j;
	int r;

	/* The calls waiting now are answered by this reload: it reads the file after them. */
	d->defers.reload_waiting = NULL;
	memset(&res, 0, sizeof(res));
	if (!d->config_path) {
		log_notice("reload: running on the embedded config; nothing to re-read");
		note(&res, 1, "kvpoold runs on its embedded config: there is no file to re-read");
		answer(&d->defers, waiters, &res);
		return 1;
	}
	if (strlen(d->config_path) >= sizeof(j->path)) {
		log_err("reload refused: config path too long");
		refuse(&res, KVP_ERR_INTERNAL, "config path too long");
		answer(&d->defers, waiters, &res);
		return -ENAMETOOLONG;
	}
	j = calloc(1, sizeof(*j));
	if (!j) {
		log_err("reload refused: out of memory");
		refuse(&res, KVP_ERR_INTERNAL, "kvpoold is out of memory");
		answer(&d->defers, waiters, &res);
		return -ENOMEM;
	}
	j->waiters = waiters;
	j->job.run = reload_run;
	j->job.done = reload_done;
	j->d = d;
	j->finished = finished;
	j->ctx = ctx;
	strcpy(j->path, d->config_path);
	j->cur = d->conf;
	j->cur.n_pools = d->n_pools;
	r = kvp_work_submit(w, &j->job);
	if (r < 0) {
		log_err("reload refused: %s", strerror(-r));
		refuse(&res, r == -ESHUTDOWN ? KVP_ERR_SHUTTING_DOWN : KVP_ERR_INTERNAL, "%s",
		       strerror(-r));
		answer(&d->defers, waiters, &res);
		free(j);
	}
	return r;
}
