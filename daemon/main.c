/* main.c - kvpoold: flags, configuration, budget check, pools, the listening socket, and the
 * event loop. */
#include <errno.h>
#include <getopt.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "daemon.h"
#include "fault.h"
#include "kvp_config.h"
#include "log.h"
#include "names.h"
#include "loop.h"
#include "notify.h"
#include "reload.h"
#include "session.h"
#include "fdstore.h"
#include "snapshot.h"
#include "remote_tier.h"
#include "budget.h"
#include "disk_tier.h"
#if KVP_HAVE_REMOTE
#include "remote.h"
#endif

static void usage(FILE *f)
{
	fprintf(f,
		"Usage: kvpoold [OPTIONS]\n"
		"The kvpool daemon: owns KV-cache memory (GPU and host pages) and serves it to\n"
		"engine processes over a unix socket.\n\n"
		"  -s, --socket PATH     listen here (default: $KVPOOL_SOCKET, the config's socket,\n"
		"                        " KVP_ROOT_SOCKET " as root, else\n"
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
	/* A kvpoold killed a moment ago may still be listening: its ring lets go of the socket
	 * shortly after it died. A live one still listens a second later. */
	for (int i = 0; connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0; i++) {
		close(fd);
		if (i == 20) {
			log_err("another kvpoold already listens on %s", path);
			return -EADDRINUSE;
		}
		usleep(50000);
		fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
		if (fd < 0)
			return -errno;
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

/* SIGTERM and SIGINT before the loop owns them (it blocks them and reads a signalfd): reading
 * a config that never arrives (a FIFO), a long prefault or --check end at once, by the signal,
 * as an unhandled one would. A thread started meanwhile (a GPU driver's) keeps them unblocked;
 * if one is delivered to it once the loop owns them, it goes on to the loop's thread. */
static pthread_t g_main_thread;

static void early_signal(int sig)
{
	static const char msg[] = "<5>kvpoold: stopped by a signal before serving\n";

	if (!pthread_equal(pthread_self(), g_main_thread)) {
		pthread_kill(g_main_thread, sig);
		return;
	}
	if (write(2, msg, sizeof(msg) - 1) < 0) {
		/* nothing more to do: the signal still ends the process */
	}
	signal(sig, SIG_DFL);
	raise(sig); /* delivered as the handler returns, with the default action */
}

static void early_signals(void)
{
	/* SA_RESTART: a thread the signal only passes through is not interrupted. */
	struct sigaction sa = { .sa_handler = early_signal, .sa_flags = SA_RESTART };
	sigset_t hup;

	g_main_thread = pthread_self();
	sigemptyset(&sa.sa_mask);
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGINT, &sa, NULL);
	/* A reload asked for during start-up waits for the loop. */
	sigemptyset(&hup);
	sigaddset(&hup, SIGHUP);
	sigprocmask(SIG_BLOCK, &hup, NULL);
}

/* A socket path that does not fit in sun_path would be bound truncated, somewhere else. */
static int check_socket_path(const char *path, const char *from)
{
	if (strlen(path) < sizeof(((struct sockaddr_un *)0)->sun_path))
		return 0;
	log_err("%s: socket path is %zu bytes, longer than the %zu a unix socket address holds: "
		"%s",
		from, strlen(path), sizeof(((struct sockaddr_un *)0)->sun_path) - 1, path);
	return -ENAMETOOLONG;
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
	int fd, o, r, code;

	early_signals();

	while ((o = getopt_long(argc, argv, "s:c:l:Vh", opts, NULL)) != -1) {
		uint32_t id;

		switch (o) {
		case 's': socket_flag = optarg; break;
		case 'c': d.config_path = optarg; break;
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
		case 'C': check_only = true; break;
		case 'V':
			printf("kvpoold %s (protocol %d, cuda %s)\n", KVP_VERSION,
			       KVP_PROTO_VERSION, KVP_HAVE_CUDA ? "built in" : "not built");
			return 0;
		case 'h': usage(stdout); return 0;
		default: usage(stderr); return 2;
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

	if (socket_flag && check_socket_path(socket_flag, "--socket") < 0)
		return 2;
	kvp_fdstore_take(); /* before the budget: adopted pools' memory is in use already */
	{
		static struct kvp_conf fresh;

		fresh = d.conf;
		fresh.n_pools = 0;
		for (uint32_t i = 0; i < d.conf.n_pools; i++)
			if (!kvp_snap_adoptable(&d.conf.pools[i]))
				fresh.pools[fresh.n_pools++] = d.conf.pools[i];
		if (kvp_daemon_check_budget(&fresh) < 0)
			return 3;
		if (kvp_budget_disk_check(&d.conf, err, sizeof(err)) < 0) {
			log_err("disk budget: %s", err);
			return 3;
		}
	}
	if (check_only) {
		log_notice("configuration %s fits this machine",
			   d.config_path ? d.config_path : "<embedded>");
		return 0;
	}
	if (kvp_snap_start_pools(&d, kvp_daemon_create_pool) < 0) {
		code = 4;
		goto out;
	}
	for (uint32_t i = 0; i < d.n_pools; i++) {
		if (d.pools[i]->conf.disk == KVP_DISK_OFF)
			continue;
		if (!(d.dt = kvp_dt_new()) || kvp_dt_bind(d.dt, d.pools, d.n_pools) < 0) {
			log_err("disk tier: cannot start (see above%s%s)", d.dt ? "" : ": ",
				d.dt ? "" : strerror(errno));
			code = 4;
			goto out;
		}
		break;
	}
	if (d.conf.remote.enabled) {
#if KVP_HAVE_REMOTE
		d.remote = kvp_remote_new(&d.conf.remote);
		if (!d.remote) {
			log_err("remote tier: cannot start the cluster client for %s: %s",
				d.conf.remote.seeds, strerror(errno));
			code = 2;
			goto out;
		}
		log_info("remote tier: Redis Cluster seeds %s", d.conf.remote.seeds);
		kvp_rt_bind(&d);
#else
		log_err("configuration: [remote] is given but kvpoold was built without the remote "
			"tier (hiredis and nettle)");
		code = 2;
		goto out;
#endif
	}

	/* Once clients can connect, a stop request waits for the loop's signalfd (start-up from
	 * here to the loop never blocks): a SIGTERM right after the socket appears is a clean
	 * stop, exit 0, not the start-up handler's end by the signal. */
	kvp_signals_block(&(sigset_t){ 0 });
	fd = kvp_activation_fd();
	if (fd >= 0) {
		log_info("serving the socket passed by socket activation");
		code = kvp_server_run(&d, fd, NULL);
		goto out;
	}
	if (socket_flag)
		snprintf(sock, sizeof(sock), "%s", socket_flag);
	else if (getenv("KVPOOL_SOCKET") || !d.config_path ||
		 strcmp(d.conf.socket, KVP_ROOT_SOCKET) == 0)
		r = kvp_names_default_socket(sock, sizeof(sock));
	else
		r = snprintf(sock, sizeof(sock), "%s", d.conf.socket) < (int)sizeof(sock)
			    ? 0
			    : -ENAMETOOLONG;
	if (!socket_flag && r < 0) {
		log_err("socket path: longer than the %zu bytes a unix socket address holds "
			"($KVPOOL_SOCKET, $XDG_RUNTIME_DIR or the config's socket)",
			sizeof(sock) - 1);
		code = 2;
		goto out;
	}
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
		/* With every session ended, each page must be free or cached and every pool's
		 * allocator and prefix tree consistent: a clean exit says so, broken books make it
		 * fail. */
#if KVP_HAVE_REMOTE
	/* Completes what is in flight (Fetch leases end) while the pools still exist. */
	kvp_remote_free(d.remote);
	d.remote = NULL;
#endif
	kvp_dt_free(d.dt); /* reads in flight end as misses: their Fetches answer */
	d.dt = NULL;
	kvp_rt_free(&d);
	if (code == 0 && kvp_daemon_check(&d) < 0) {
		log_err("at exit: pages are still leased with no session left, or a pool's "
			"allocator or prefix tree is inconsistent");
		code = 70;
	}
	for (uint32_t i = 0; i < d.n_pools; i++)
		kvp_pool_destroy(d.pools[i]);
	kvp_activation_close();
	return code;
}
