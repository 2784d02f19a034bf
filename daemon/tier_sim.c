/* tier_sim.c - the sim backend of device tiers: a memfd like the host tier (never locked, never
 * huge) standing in for a GPU, with the CPU kernels (kernels/kv_copy_cpu.c) for demotion and
 * promotion. */
#include <stdlib.h>

#include "tier_shm.h"

struct kvp_tier_copy {
	struct kvp_copy_geom g;
	void *dev, *host;
};

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
};
