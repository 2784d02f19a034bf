/* checkconfig.c - `kvpoolctl check-config FILE`: validates a config and prints the memory plan
 * and the budget check against this machine (host memory, then the disk tiers' disks), starting
 * nothing. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "budget.h"
#include "config.h"
#include "json.h"
#include "units.h"

int kvp_check_config(const char *path, int json);

int kvp_check_config(const char *path, int json)
{
	struct kvp_conf c;
	struct kvp_budget_verdict v;
	char err[512], line[512];
	int r;

	r = kvp_conf_load_file(&c, path, err, sizeof(err));
	if (r < 0) {
		if (json) {
			printf("{\"valid\":false,\"error\":");
			kvp_json_str(stdout, err);
			printf("}\n");
		}
		fprintf(stderr, "kvpoolctl: invalid config: %s\n", err);
		return 2;
	}
	r = kvp_budget_check(&c, kvp_budget_env_system(), &v);
	if (r == -ENOMEM)
		kvp_budget_format(&v, line, sizeof(line));
	else if (r == -ENODEV)
		snprintf(line, sizeof(line), "pool %s: NUMA node %d does not exist", v.pool,
			 v.numa_node);
	else if (r < 0)
		snprintf(line, sizeof(line), "cannot read this machine's limits: %s", strerror(-r));
	else if ((r = kvp_budget_disk_check(&c, line, sizeof(line))) < 0 && !line[0])
		snprintf(line, sizeof(line), "cannot check the disk tiers' disks: %s",
			 strerror(-r));
	else if (r == 0)
		snprintf(line, sizeof(line), "fits this machine%s%s", v.warning[0] ? "; " : "",
			 v.warning);
	if (json) {
		printf("{\"valid\":true,\"fits\":%s,\"budget\":", r == 0 ? "true" : "false");
		kvp_json_str(stdout, line);
		printf(",\"pools\":[");
	} else {
		printf("%s: valid, %u pools\n", path, c.n_pools);
	}
	for (uint32_t i = 0; i < c.n_pools; i++) {
		const struct kvp_pool_conf *p = &c.pools[i];
		uint64_t tb = kvp_conf_token_bytes(p), pb = kvp_conf_page_bytes(p);
		uint64_t db = kvp_conf_device_bytes(p), hb = kvp_conf_host_bytes(p);

		if (json) {
			printf("%s{\"name\":", i ? "," : "");
			kvp_json_str(stdout, p->name);
			printf(",\"token_bytes\":%lu,\"page_bytes\":%lu,"
			       "\"device\":\"%s\",\"device_bytes\":%lu,\"device_tokens\":%lu,"
			       "\"host_bytes\":%lu,\"host_tokens\":%lu,\"numa_node\":%d,"
			       "\"disk\":\"%s\",\"disk_bytes\":%lu,\"disk_tokens\":%lu,\"disk_path\":",
			       (unsigned long)tb, (unsigned long)pb,
			       kvp_device_kind_name(p->device), (unsigned long)db,
			       (unsigned long)(p->device_pages * p->page_tokens), (unsigned long)hb,
			       (unsigned long)(p->host_pages * p->page_tokens), p->numa_node,
			       kvp_disk_mode_name(p->disk), (unsigned long)kvp_conf_disk_bytes(p),
			       (unsigned long)(p->disk == KVP_DISK_OFF
						       ? 0
						       : p->disk_pages * p->page_tokens));
			kvp_json_str(stdout, p->disk_path);
			printf(",\"disk_offset\":%lu}", (unsigned long)p->disk_offset);
		} else {
			char dsz[32], hsz[32];

			kvp_units_bytes(db, dsz, sizeof(dsz));
			kvp_units_bytes(hb, hsz, sizeof(hsz));
			printf("pool %s: %lu B/token, %lu B/page (%u tokens)\n", p->name,
			       (unsigned long)tb, (unsigned long)pb, p->page_tokens);
			printf("  device %-4s %13s  %12lu tokens\n",
			       kvp_device_kind_name(p->device), dsz,
			       (unsigned long)(p->device_pages * p->page_tokens));
			printf("  host        %13s  %12lu tokens  NUMA node %s%d, hugepages %s, "
			       "mlock %s\n",
			       hsz, (unsigned long)(p->host_pages * p->page_tokens),
			       p->numa_node < 0 ? "auto->" : "",
			       p->numa_node < 0 ? 0 : p->numa_node, kvp_tristate_name(p->hugepages),
			       kvp_tristate_name(p->mlock));
			if (p->disk != KVP_DISK_OFF) {
				char ksz[32];

				kvp_units_bytes(kvp_conf_disk_bytes(p), ksz, sizeof(ksz));
				printf("  disk        %13s  %12lu tokens  %s, %s", ksz,
				       (unsigned long)(p->disk_pages * p->page_tokens),
				       p->disk_path, kvp_disk_mode_name(p->disk));
				if (p->disk_offset)
					printf(", from byte %lu", (unsigned long)p->disk_offset);
				printf("\n");
			}
		}
	}
	if (json)
		printf("]}\n");
	else
		printf("budget: %s\n", line);
	return r == 0 ? 0 : 1;
}
