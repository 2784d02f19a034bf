/* main.c - kvpoold: flags, configuration, budget check, pools, the listening socket, and the
 * event loop. */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "budget.h"
#include "daemon.h"
#include "fault.h"
#include "kvp_config.h"
#include "log.h"
#include "loop.h"
#include "notify.h"

#define DEFAULT_ROOT_SOCKET "/run/kvpool/kvpoold.sock"

static void usage(FILE *f)
{
	fprintf(f,
		"Usage: kvpoold [OPTIONS]\n"
		"The kvpool daemon: owns KV-cache memory (GPU and host pages) and serves it to\n"
		"engine processes over a unix socket.\n\n"
		"  -s, --socket PATH     listen here (default: $KVPOOL_SOCKET, the config's socket,\n"
		"                        /run/kvpool/kvpoold.sock as root, else\n"
		"                        $XDG_RUNTIME_DIR/kvpool/kvpoold.sock)\n"
		"  -c, --config FILE     INI configuration (default: an embedded one-pool config)\n"
		"  -l, --log-level LVL   err, warning, notice, info, debug\n"
		"      --allow-uid UID   allow this uid (repeatable; with any allow list, others\n"
		"                        get PERMISSION_DENIED)\n"
		"      --allow-gid GID   allow this group (repeatable)\n"
		"      --check           load the config, check the memory budget, exit\n"
		"  -V, --version         print the version\n"
		"  -h, --help            this text\n\n"
		"Under systemd: Type=notify (READY, STATUS, WATCHDOG, STOPPING) and socket\n"
		"activation (LISTEN_FDS) are used when present. SIGTERM/SIGINT stop cleanly,\n"
		"SIGHUP reloads the configuration.\n"
		"Exit status: 0 clean stop, 1 runtime failure, 2 usage or configuration error,\n"
		"3 host memory budget exceeded, 4 a pool could not be created.\n");
}

static int default_socket(char *buf, size_t len)
{
	const char *env = getenv("KVPOOL_SOCKET"), *xdg = getenv("XDG_RUNTIME_DIR");

	if (env && env[0])
		return snprintf(buf, len, "%s", env) < (int)len ? 0 : -ENAMETOOLONG;
	if (geteuid() == 0 || !xdg || !xdg[0])
		return snprintf(buf, len, "%s", DEFAULT_ROOT_SOCKET) < (int)len ? 0 : -ENAMETOOLONG;
	return snprintf(buf, len, "%s/kvpool/kvpoold.sock", xdg) < (int)len ? 0 : -ENAMETOOLONG;
}

static int mkdir_parents(const char *path)
{
	char dir[sizeof(((struct sockaddr_un *)0)->sun_path)];
	char *slash;

	snprintf(dir, sizeof(dir), "%s", path);
	slash = strrchr(dir, '/');
	if (!slash || slash == dir)
		return 0;
	*slash = 0;
	for (char *p = dir + 1; *p; p++) {
		if (*p != '/')
			continue;
		*p = 0;
		if (mkdir(dir, 0755) < 0 && errno != EEXIST)
			return -errno;
		*p = '/';
	}
	if (mkdir(dir, 0750) < 0 && errno != EEXIST)
		return -errno;
	return 0;
}

/* Binds path, replacing a stale socket but never a live daemon's. */
static int listen_unix(const char *path)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int fd, r;

	if (strlen(path) >= sizeof(sa.sun_path)) {
		log_err("socket path too long: %s", path);
		return -ENAMETOOLONG;
	}
	strcpy(sa.sun_path, path);
	if ((r = mkdir_parents(path)) < 0) {
		log_err("cannot create the directory of %s: %s", path, strerror(-r));
		return r;
	}
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0) {
		log_err("another kvpoold already listens on %s", path);
		close(fd);
		return -EADDRINUSE;
	}
	close(fd);
	unlink(path);
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 || chmod(path, 0660) < 0 ||
	    listen(fd, 512) < 0) {
		r = -errno;
		log_err("cannot listen on %s: %s", path, strerror(errno));
		close(fd);
		return r;
	}
	return fd;
}

static int parse_id(const char *s, uint32_t *out)
{
	char *end;
	unsigned long v = strtoul(s, &end, 10);

	if (!*s || *end || v > UINT32_MAX - 1)
		return -EINVAL;
	*out = (uint32_t)v;
	return 0;
}

/* Budget check of every pool of c; logs the refusal. 0, or -ENOMEM when it does not fit. */
static int check_budget(const struct kvp_conf *c)
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
		log_err("pool %s: NUMA node %d does not exist on this machine", v.pool, v.numa_node);
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

static int create_pools(struct kvp_daemon *d, uint32_t from)
{
	for (uint32_t i = from; i < d->conf.n_pools; i++) {
		const struct kvp_pool_conf *pc = &d->conf.pools[i];
		struct kvp_fail f = { 0 };
		struct kvp_pool *p = kvp_pool_create(pc, i, &f);

		if (!p) {
			log_err("pool %s: %s", pc->name, f.msg);
			return -1;
		}
		d->pools[i] = p;
		d->n_pools = i + 1;
		log_notice("pool %s: %u layers x %u kv heads x %u dim %s, %u tokens/page, "
			   "%lu B/token; device %s %lu pages (%lu MiB, NUMA %d), host %lu pages "
			   "(%lu MiB, NUMA %d%s%s)%s%s",
			   pc->name, pc->layers, pc->kv_heads, pc->head_dim, kvp_dtype_name(pc->dtype),
			   pc->page_tokens, (unsigned long)kvp_conf_token_bytes(pc),
			   kvp_pool_has_tier(p, KVP_TIER_DEVICE) ? kvp_device_kind_name(pc->device)
								  : "none",
			   (unsigned long)(kvp_pool_has_tier(p, KVP_TIER_DEVICE) ? pc->device_pages : 0),
			   (unsigned long)(p->mem[KVP_TIER_DEVICE].bytes >> 20),
			   p->mem[KVP_TIER_DEVICE].numa_node, (unsigned long)pc->host_pages,
			   (unsigned long)(p->mem[KVP_TIER_HOST].bytes >> 20),
			   p->mem[KVP_TIER_HOST].numa_node,
			   p->mem[KVP_TIER_HOST].locked ? ", locked" : "",
			   p->mem[KVP_TIER_HOST].huge ? ", huge pages" : "", p->note[0] ? ": " : "",
			   p->note);
	}
	return 0;
}

static bool same_pool_shape(const struct kvp_pool_conf *a, const struct kvp_pool_conf *b)
{
	return a->layers == b->layers && a->kv_heads == b->kv_heads && a->head_dim == b->head_dim &&
	       a->page_tokens == b->page_tokens && a->dtype == b->dtype && a->device == b->device &&
	       a->cuda_device == b->cuda_device && a->device_pages == b->device_pages &&
	       a->host_pages == b->host_pages && a->numa_node == b->numa_node &&
	       a->hugepages == b->hugepages && a->mlock == b->mlock && a->eviction == b->eviction;
}

/* SIGHUP / Reload: re-read the file; apply what can change safely, refuse the rest. */
void kvp_daemon_reload(struct kvp_daemon *d);
void kvp_daemon_reload(struct kvp_daemon *d)
{
	struct kvp_conf *n;
	char err[512];
	uint32_t old_pools = d->n_pools;

	if (!d->config_path) {
		log_notice("reload: running on the embedded config; nothing to re-read");
		return;
	}
	n = malloc(sizeof(*n));
	if (!n)
		return;
	if (kvp_conf_load_file(n, d->config_path, err, sizeof(err)) < 0) {
		log_err("reload refused, keeping the running config: %s", err);
		free(n);
		return;
	}
	for (uint32_t i = 0; i < d->n_pools; i++) {
		const struct kvp_pool_conf *cur = &d->conf.pools[i];
		bool found = false;

		for (uint32_t j = 0; j < n->n_pools; j++) {
			if (strcmp(n->pools[j].name, cur->name))
				continue;
			found = true;
			if (!same_pool_shape(cur, &n->pools[j]) || j != i) {
				log_err("reload refused, keeping the running config: pool %s changes "
					"size, geometry or place; restart kvpoold for that",
					cur->name);
				free(n);
				return;
			}
		}
		if (!found) {
			log_err("reload refused, keeping the running config: pool %s was removed; "
				"restart kvpoold for that",
				cur->name);
			free(n);
			return;
		}
	}
	if (n->n_pools > old_pools && check_budget(n) < 0) {
		log_err("reload refused, keeping the running config: new pools do not fit");
		free(n);
		return;
	}
	/* Safe changes: quotas, access lists, log level, keep-alive, limits; new pools. */
	for (uint32_t i = 0; i < old_pools; i++) {
		if (d->conf.pools[i].session_quota_tokens != n->pools[i].session_quota_tokens)
			log_notice("reload: pool %s session quota %lu -> %lu tokens", n->pools[i].name,
				   (unsigned long)d->conf.pools[i].session_quota_tokens,
				   (unsigned long)n->pools[i].session_quota_tokens);
		kvp_pool_conf_copy_access(&d->pools[i]->conf, &n->pools[i]);
	}
	{
		struct kvp_pool_conf keep[KVP_MAX_POOLS];

		memcpy(keep, d->conf.pools, sizeof(keep));
		d->conf = *n;
		memcpy(d->conf.pools, keep, sizeof(keep[0]) * old_pools);
		for (uint32_t i = 0; i < old_pools; i++)
			kvp_pool_conf_copy_access(&d->conf.pools[i], &n->pools[i]);
		d->conf.n_pools = old_pools;
	}
	g_log_level = n->log_level;
	for (uint32_t i = old_pools; i < n->n_pools; i++) {
		d->conf.pools[i] = n->pools[i];
		d->conf.n_pools = i + 1;
		if (create_pools(d, i) < 0) {
			d->conf.n_pools = d->n_pools;
			break;
		}
	}
	kvp_daemon_recheck_sessions(d);
	log_notice("reload: done (%u pools)", d->n_pools);
	free(n);
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "socket", required_argument, NULL, 's' },
		{ "config", required_argument, NULL, 'c' },
		{ "log-level", required_argument, NULL, 'l' },
		{ "allow-uid", required_argument, NULL, 'U' },
		{ "allow-gid", required_argument, NULL, 'G' },
		{ "check", no_argument, NULL, 'C' },
		{ "version", no_argument, NULL, 'V' },
		{ "help", no_argument, NULL, 'h' },
		{ 0 },
	};
	static struct kvp_daemon d;
	const char *socket_flag = NULL, *level_flag = NULL;
	char sock[108], err[512];
	bool check_only = false;
	sigset_t sigs;
	int fd, o, r, code;

	kvp_signals_block(&sigs);

	while ((o = getopt_long(argc, argv, "s:c:l:Vh", opts, NULL)) != -1) {
		uint32_t id;

		switch (o) {
		case 's':
			socket_flag = optarg;
			break;
		case 'c':
			d.config_path = optarg;
			break;
		case 'l':
			level_flag = optarg;
			if (kvp_log_level_parse(optarg) < 0) {
				fprintf(stderr, "kvpoold: bad --log-level '%s'\n", optarg);
				return 2;
			}
			break;
		case 'U':
		case 'G':
			if (parse_id(optarg, &id) < 0 ||
			    (o == 'U' ? d.n_flag_uids : d.n_flag_gids) >= KVP_MAX_IDS) {
				fprintf(stderr, "kvpoold: bad or too many --allow-%s '%s'\n",
					o == 'U' ? "uid" : "gid", optarg);
				return 2;
			}
			if (o == 'U')
				d.flag_uids[d.n_flag_uids++] = id;
			else
				d.flag_gids[d.n_flag_gids++] = id;
			break;
		case 'C':
			check_only = true;
			break;
		case 'V':
			printf("kvpoold %s (protocol %d, cuda %s)\n", KVP_VERSION, KVP_PROTO_VERSION,
			       KVP_HAVE_CUDA ? "built in" : "not built");
			return 0;
		case 'h':
			usage(stdout);
			return 0;
		default:
			usage(stderr);
			return 2;
		}
	}
	if (optind < argc) {
		fprintf(stderr, "kvpoold: unexpected argument '%s'\n", argv[optind]);
		return 2;
	}
	r = d.config_path ? kvp_conf_load_file(&d.conf, d.config_path, err, sizeof(err))
			  : kvp_conf_load_embedded(&d.conf, err, sizeof(err));
	if (r < 0) {
		log_err("configuration: %s", err);
		return 2;
	}
	g_log_level = level_flag ? kvp_log_level_parse(level_flag) : d.conf.log_level;
	d.self_uid = geteuid();
	d.started_ms = kvp_now_ms();
	log_info("kvpoold %s starting (config %s)", KVP_VERSION,
		 d.config_path ? d.config_path : "<embedded>");
	if (kvp_fault_init(err, sizeof(err)) < 0) {
		log_err("%s", err);
		return 2;
	}
	if (getenv("KVPOOLD_FAULTS") && *getenv("KVPOOLD_FAULTS"))
		log_warn("failure injection armed: KVPOOLD_FAULTS=%s", getenv("KVPOOLD_FAULTS"));

	if (check_budget(&d.conf) < 0)
		return 3;
	if (check_only) {
		log_notice("configuration %s fits this machine", d.config_path ? d.config_path : "<embedded>");
		return 0;
	}
	if (create_pools(&d, 0) < 0) {
		code = 4;
		goto out;
	}

	fd = kvp_activation_fd();
	if (fd >= 0) {
		log_info("serving the socket passed by socket activation");
		code = kvp_server_run(&d, fd, NULL);
		goto out;
	}
	if (socket_flag)
		snprintf(sock, sizeof(sock), "%s", socket_flag);
	else if (getenv("KVPOOL_SOCKET") || !d.config_path || strcmp(d.conf.socket, DEFAULT_ROOT_SOCKET) == 0)
		default_socket(sock, sizeof(sock));
	else
		snprintf(sock, sizeof(sock), "%s", d.conf.socket);
	fd = listen_unix(sock);
	if (fd < 0) {
		code = 1;
		goto out;
	}
	log_info("listening on %s", sock);
	code = kvp_server_run(&d, fd, sock);
	close(fd);
out:
	while (d.sessions)
		kvp_session_destroy(&d, d.sessions);
	/* With every session ended, each page must be free or cached and every pool's allocator
	 * and prefix tree consistent: a clean exit says so, broken books make it fail. */
	if (code == 0 && kvp_daemon_check(&d) < 0) {
		log_err("at exit: pages are still leased with no session left, or a pool's "
			"allocator or prefix tree is inconsistent");
		code = 70;
	}
	for (uint32_t i = 0; i < d.n_pools; i++)
		kvp_pool_destroy(d.pools[i]);
	return code;
}
