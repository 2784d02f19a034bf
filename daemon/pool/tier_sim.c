/* tier_sim.c - the sim backend of device tiers: a memfd like the host tier (never locked, never
 * huge) standing in for a GPU, with the CPU kernels (kernels/kv_copy_cpu.c) for demotion and
 * promotion. Copies are synchronous; for tests, KVPOOLD_COPY_DELAY_MS makes copy_start's copies
 * land asynchronously: the kernel runs in flight_wait (the worker thread) after that delay, so
 * the daemon's in-flight path runs without a GPU. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "log.h"
#include "tier_shm.h"

struct kvp_tier_copy {
	struct kvp_copy_geom g;
	void *dev, *host;
	long delay_ms; /* KVPOOLD_COPY_DELAY_MS at copy_open; 0: copy_start is synchronous */
};

struct kvp_tier_flight {
	struct kvp_tier_copy *c;
	enum kvp_copy_dir dir;
	uint32_t n;
	uint32_t *src, *dst; /* n each, one allocation */
};

/* KVPOOLD_COPY_DELAY_MS (tests): copies through copy_start land that long after, on the worker. */
static long copy_delay_ms(void)
{
	const char *v = getenv("KVPOOLD_COPY_DELAY_MS");
	char *end;
	long ms;

	if (!v || !*v)
		return 0;
	ms = strtol(v, &end, 10);
	if (*end || ms <= 0 || ms > 600000)
		return 0;
	log_warn("sim copies: delayed %ld ms, asynchronous (KVPOOLD_COPY_DELAY_MS)", ms);
	return ms;
}

/* The sim tier asks for no huge pages and no lock, whatever the spec says. */
static struct kvp_tier_spec sim_spec(const struct kvp_tier_spec *s)
{
	struct kvp_tier_spec o = *s;

	o.hugepages = KVP_OPT_OFF;
	o.mlock = KVP_OPT_OFF;
	return o;
}

static int sim_create(struct kvp_tier_mem *t, const struct kvp_tier_spec *s, char *note,
		      size_t notelen, struct kvp_tier_fail *tf)
{
	struct kvp_tier_spec o = sim_spec(s);
	int r = kvp_tier_shm_create(t, &o, note, notelen, tf);

	if (r == 0) {
		t->ops = &kvp_tier_sim_ops;
		t->backend = KVP_BACKEND_KIND_SIM;
	}
	return r;
}

static int sim_adopt(struct kvp_tier_mem *t, int fd, const struct kvp_tier_spec *s,
		     struct kvp_tier_fail *tf)
{
	struct kvp_tier_spec o = sim_spec(s);
	int r = kvp_tier_shm_adopt(t, fd, &o, tf);

	if (r == 0) {
		t->ops = &kvp_tier_sim_ops;
		t->backend = KVP_BACKEND_KIND_SIM;
	}
	return r;
}

static int sim_copy_open(struct kvp_tier_mem *dev, struct kvp_tier_mem *host,
			 const struct kvp_copy_geom *g, struct kvp_tier_copy **out,
			 struct kvp_tier_fail *tf)
{
	struct kvp_tier_copy *c;

	if (!dev->base || !host->base || kvp_copy_geom_check(g))
		return kvp_tier_err(tf, KVP_TIER_E_INVALID,
				    "sim copies: no tier or a bad geometry");
	c = malloc(sizeof(*c));
	if (!c)
		return kvp_tier_err(tf, KVP_TIER_E_INTERNAL, "sim copies: out of memory");
	c->g = *g;
	c->dev = dev->base;
	c->host = host->base;
	c->delay_ms = copy_delay_ms();
	*out = c;
	return 0;
}

static int sim_copy(struct kvp_tier_copy *c, enum kvp_copy_dir dir, const uint32_t *src,
		    const uint32_t *dst, uint32_t n)
{
	if (dir == KVP_COPY_DEMOTE)
		return kvp_copy_dev_to_host_cpu(&c->g, c->dev, c->host, src, dst, n);
	return kvp_copy_host_to_dev_cpu(&c->g, c->host, c->dev, src, dst, n);
}

/* The CPU kernels are done when they return. */
static int sim_copy_wait(struct kvp_tier_copy *c)
{
	(void)c;
	return 0;
}

static void sim_copy_close(struct kvp_tier_copy *c)
{
	free(c);
}

static int sim_copy_start(struct kvp_tier_copy *c, enum kvp_copy_dir dir, const uint32_t *src,
			  const uint32_t *dst, uint32_t n, struct kvp_tier_flight **out)
{
	struct kvp_tier_flight *f;
	int r;

	*out = NULL;
	if (!c->delay_ms)
		return sim_copy(c, dir, src, dst, n);
	/* Refuse what the kernel would refuse now, not later on the worker. */
	if ((r = kvp_copy_batch_check(&c->g, c->dev, c->host, dir == KVP_COPY_DEMOTE ? src : dst,
				      dir == KVP_COPY_DEMOTE ? dst : src, n)) < 0)
		return r;
	f = malloc(sizeof(*f) + 2 * (size_t)n * sizeof(uint32_t));
	if (!f)
		return -ENOMEM;
	f->c = c;
	f->dir = dir;
	f->n = n;
	f->src = (uint32_t *)(f + 1);
	f->dst = f->src + n;
	memcpy(f->src, src, n * sizeof(uint32_t));
	memcpy(f->dst, dst, n * sizeof(uint32_t));
	*out = f;
	return 1;
}

static int sim_flight_wait(struct kvp_tier_flight *f)
{
	struct timespec ts = { f->c->delay_ms / 1000, (f->c->delay_ms % 1000) * 1000000L };

	while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
		;
	return sim_copy(f->c, f->dir, f->src, f->dst, f->n);
}

static void sim_flight_free(struct kvp_tier_flight *f)
{
	free(f);
}

const struct kvp_tier_ops kvp_tier_sim_ops = {
	.name = "sim",
	.kind = KVP_BACKEND_KIND_SIM,
	.create = sim_create,
	.adopt = sim_adopt,
	.destroy = kvp_tier_shm_destroy,
	.copy_open = sim_copy_open,
	.copy = sim_copy,
	.copy_wait = sim_copy_wait,
	.copy_close = sim_copy_close,
	.copy_start = sim_copy_start,
	.flight_wait = sim_flight_wait,
	.flight_free = sim_flight_free,
};
