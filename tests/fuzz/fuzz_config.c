/* fuzz_config.c - libFuzzer target: arbitrary text through the INI config loader. A load either
 * fails with a message or yields a config whose pools are all valid. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static struct kvp_conf c;
	char err[512];
	char *text = malloc(size + 1);

	if (!text)
		return 0;
	memcpy(text, data, size);
	text[size] = 0;
	if (kvp_conf_load_string(&c, text, "fuzz", err, sizeof(err)) == 0) {
		for (uint32_t i = 0; i < c.n_pools; i++) {
			const struct kvp_pool_conf *p = &c.pools[i];

			if (!p->name[0] || !p->layers || !p->page_tokens || !p->kv_heads ||
			    !p->head_dim || p->dtype >= KVP_CONF_DTYPE_MAX ||
			    p->device_pages + p->host_pages == 0 || p->device_pages >= UINT32_MAX ||
			    p->host_pages >= UINT32_MAX)
				abort();
		}
	} else if (!err[0]) {
		abort(); /* a refusal always says why */
	}
	free(text);
	return 0;
}
