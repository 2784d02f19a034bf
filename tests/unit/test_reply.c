/* test_reply.c - the reply arena: small pieces from the inline buffer, aligned and zeroed;
 * large ones and the overflow from malloc, every one freed by release (ASan and the counts
 * show it); adopted buffers; the descriptor slots; typed failures written into the Status. */
#include <CUnit/Basic.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fault.h"
#include "reply.h"
#include "suite.h"

static bool inside(const struct kvp_reply *r, const void *p, size_t n)
{
	const unsigned char *c = p;

	return c >= r->inl && c + n <= r->inl + sizeof(r->inl);
}

static void test_reply_init_sets_id_and_status(void)
{
	struct kvp_reply r;

	memset(&r, 0xa5, sizeof(r));
	kvp_reply_init(&r, 42);
	CU_ASSERT_EQUAL(r.resp.id, 42);
	CU_ASSERT_PTR_EQUAL(r.resp.status, &r.status);
	CU_ASSERT_EQUAL(r.status.code, 0);
	CU_ASSERT_EQUAL(r.resp.result_case, KVPOOL__RESPONSE__RESULT__NOT_SET);
	CU_ASSERT_EQUAL(r.nallocs, 0);
	CU_ASSERT_PTR_NULL(r.allocs);
	CU_ASSERT_EQUAL(r.nfds, 0);
	CU_ASSERT_EQUAL(r.inl_used, 0);
	CU_ASSERT_FALSE(r.close_after);
	kvp_reply_release(&r);
}

static void test_reply_alloc_inline_then_malloc(void)
{
	struct kvp_reply r;
	unsigned char *a, *b, *big, *over;
	size_t used;

	kvp_reply_init(&r, 1);
	a = kvp_reply_alloc(&r, 3);
	b = kvp_reply_alloc(&r, 40);
	CU_ASSERT_PTR_NOT_NULL_FATAL(a);
	CU_ASSERT_PTR_NOT_NULL_FATAL(b);
	CU_ASSERT_TRUE(inside(&r, a, 3));
	CU_ASSERT_TRUE(inside(&r, b, 40));
	CU_ASSERT_EQUAL((uintptr_t)a % _Alignof(max_align_t), 0);
	CU_ASSERT_EQUAL((uintptr_t)b % _Alignof(max_align_t), 0);
	CU_ASSERT_TRUE(b >= a + 3);
	CU_ASSERT_EQUAL(r.nallocs, 0);
	for (int i = 0; i < 40; i++)
		CU_ASSERT_EQUAL(b[i], 0);
	memset(b, 0xff, 40);
	/* larger than the inline buffer: malloc'ed, zeroed, owned by the reply */
	big = kvp_reply_alloc(&r, KVP_REPLY_INLINE + 1);
	CU_ASSERT_PTR_NOT_NULL_FATAL(big);
	CU_ASSERT_FALSE(inside(&r, big, 1));
	CU_ASSERT_EQUAL(r.nallocs, 1);
	for (size_t i = 0; i < KVP_REPLY_INLINE + 1; i++)
		if (big[i])
			CU_FAIL("malloc'ed piece not zeroed");
	/* the inline buffer fills up, then the pieces go to malloc */
	used = r.inl_used;
	while (r.inl_used + 64 <= sizeof(r.inl))
		CU_ASSERT_TRUE(inside(&r, kvp_reply_alloc(&r, 64), 64));
	CU_ASSERT_TRUE(r.inl_used > used);
	CU_ASSERT_EQUAL(r.nallocs, 1);
	over = kvp_reply_alloc(&r, 64);
	CU_ASSERT_PTR_NOT_NULL_FATAL(over);
	CU_ASSERT_FALSE(inside(&r, over, 64));
	CU_ASSERT_EQUAL(r.nallocs, 2);
	/* zero bytes is a valid, distinct piece */
	CU_ASSERT_PTR_NOT_NULL(kvp_reply_alloc(&r, 0));
	kvp_reply_release(&r);
	CU_ASSERT_EQUAL(r.nallocs, 0);
	CU_ASSERT_PTR_NULL(r.allocs);
}

/* Many malloc'ed pieces and adopted buffers: all freed by release (the ASan build reports a
 * leak otherwise), and the reply can be used again. */
static void test_reply_release_frees_all(void)
{
	struct kvp_reply r;

	kvp_reply_init(&r, 1);
	for (int i = 0; i < 100; i++)
		CU_ASSERT_PTR_NOT_NULL(kvp_reply_alloc(&r, KVP_REPLY_INLINE * 2));
	CU_ASSERT_EQUAL(r.nallocs, 100);
	CU_ASSERT_TRUE(r.capallocs >= 100);
	CU_ASSERT_EQUAL(kvp_reply_adopt(&r, strdup("adopted")), 0);
	CU_ASSERT_EQUAL(r.nallocs, 101);
	kvp_reply_release(&r);
	CU_ASSERT_EQUAL(r.nallocs, 0);
	CU_ASSERT_EQUAL(r.capallocs, 0);
	kvp_reply_init(&r, 2);
	CU_ASSERT_PTR_NOT_NULL(kvp_reply_alloc(&r, KVP_REPLY_INLINE * 2));
	CU_ASSERT_EQUAL(r.nallocs, 1);
	kvp_reply_release(&r);
	kvp_reply_release(&r); /* twice is harmless */
}

static void test_reply_msg_and_strdup(void)
{
	struct kvp_reply r;
	Kvpool__PingResp *p;
	char *s;

	kvp_reply_init(&r, 1);
	p = KVP_REPLY_NEW(&r, Kvpool__PingResp, kvpool__ping_resp__descriptor);
	CU_ASSERT_PTR_NOT_NULL_FATAL(p);
	CU_ASSERT_PTR_EQUAL(p->base.descriptor, &kvpool__ping_resp__descriptor);
	CU_ASSERT_EQUAL(p->nonce, 0);
	s = kvp_reply_strdup(&r, "pool a");
	CU_ASSERT_PTR_NOT_NULL_FATAL(s);
	CU_ASSERT_STRING_EQUAL(s, "pool a");
	CU_ASSERT_TRUE(inside(&r, s, 7));
	kvp_reply_release(&r);
}

static void test_reply_add_fd_bounded(void)
{
	struct kvp_reply r;

	kvp_reply_init(&r, 1);
	for (int i = 0; i < KVP_REPLY_MAX_FDS; i++)
		CU_ASSERT_EQUAL(kvp_reply_add_fd(&r, 10 + i), i);
	CU_ASSERT_EQUAL(kvp_reply_add_fd(&r, 99), -ENOSPC);
	CU_ASSERT_EQUAL(r.nfds, KVP_REPLY_MAX_FDS);
	for (int i = 0; i < KVP_REPLY_MAX_FDS; i++)
		CU_ASSERT_EQUAL(r.fds[i], 10 + i);
	kvp_reply_release(&r);
	kvp_reply_init(&r, 2);
	CU_ASSERT_EQUAL(r.nfds, 0);
	kvp_reply_release(&r);
}

/* The "reply_alloc" fault site fails a piece, inline or not; the next one succeeds. */
static void test_reply_alloc_fault_site(void)
{
	struct kvp_reply r;
	char err[128];

	setenv("KVPOOLD_FAULTS", "reply_alloc:2:1", 1);
	CU_ASSERT_EQUAL_FATAL(kvp_fault_init(err, sizeof(err)), 0);
	kvp_reply_init(&r, 1);
	CU_ASSERT_PTR_NOT_NULL(kvp_reply_alloc(&r, 8));
	CU_ASSERT_PTR_NULL(kvp_reply_alloc(&r, 8));
	CU_ASSERT_PTR_NOT_NULL(kvp_reply_alloc(&r, 8));
	unsetenv("KVPOOLD_FAULTS");
	CU_ASSERT_EQUAL_FATAL(kvp_fault_init(err, sizeof(err)), 0);
	kvp_reply_release(&r);
}

static void test_reply_fail_fills_status_and_detail(void)
{
	struct kvp_reply r;
	struct kvp_fail f;

	kvp_fail_init(&f);
	kvp_fail(&f, KVP_ERR_QUOTA_EXCEEDED, "pool %s: over quota", "a");
	f.detail = KVP_FAIL_QUOTA;
	f.quota.quota = 40;
	f.quota.held = 24;
	f.quota.requested = 20;
	kvp_reply_init(&r, 1);
	kvp_reply_fail(&r, &f);
	CU_ASSERT_EQUAL(r.status.code, KVP_ERR_QUOTA_EXCEEDED);
	CU_ASSERT_STRING_EQUAL(r.status.message, "pool a: over quota");
	CU_ASSERT_EQUAL(r.status.detail_case, KVPOOL__STATUS__DETAIL_QUOTA);
	CU_ASSERT_PTR_NOT_NULL_FATAL(r.status.quota);
	CU_ASSERT_EQUAL(r.status.quota->quota_tokens, 40);
	CU_ASSERT_EQUAL(r.status.quota->held_tokens, 24);
	CU_ASSERT_EQUAL(r.status.quota->requested_tokens, 20);
	kvp_reply_release(&r);

	kvp_fail_init(&f);
	kvp_fail(&f, KVP_ERR_GEOMETRY_MISMATCH, "geometry");
	f.detail = KVP_FAIL_GEOMETRY;
	f.geom.expected = (struct kvp_geom){ 2, 1, 4, 1, 16 };
	f.geom.actual = (struct kvp_geom){ 1, 1, 4, 1, 16 };
	kvp_reply_init(&r, 1);
	kvp_reply_fail(&r, &f);
	CU_ASSERT_EQUAL(r.status.detail_case, KVPOOL__STATUS__DETAIL_GEOMETRY);
	CU_ASSERT_PTR_NOT_NULL_FATAL(r.status.geometry);
	CU_ASSERT_EQUAL(r.status.geometry->expected->layers, 2);
	CU_ASSERT_EQUAL(r.status.geometry->actual->layers, 1);
	CU_ASSERT_EQUAL(r.status.geometry->actual->page_tokens, 16);
	kvp_reply_release(&r);

	/* the message cannot be copied: a fixed text, still a Status */
	kvp_fail_init(&f);
	kvp_fail(&f, KVP_ERR_INTERNAL, "lost");
	setenv("KVPOOLD_FAULTS", "reply_alloc:1", 1);
	{
		char err[128];

		CU_ASSERT_EQUAL_FATAL(kvp_fault_init(err, sizeof(err)), 0);
		kvp_reply_init(&r, 1);
		kvp_reply_fail(&r, &f);
		unsetenv("KVPOOLD_FAULTS");
		CU_ASSERT_EQUAL_FATAL(kvp_fault_init(err, sizeof(err)), 0);
	}
	CU_ASSERT_EQUAL(r.status.code, KVP_ERR_INTERNAL);
	CU_ASSERT_STRING_EQUAL(r.status.message, "out of memory");
	kvp_reply_release(&r);
}

int main(void)
{
	static const struct h_test tests[] = {
		H_TEST(test_reply_init_sets_id_and_status),
		H_TEST(test_reply_alloc_inline_then_malloc),
		H_TEST(test_reply_release_frees_all),
		H_TEST(test_reply_msg_and_strdup),
		H_TEST(test_reply_add_fd_bounded),
		H_TEST(test_reply_alloc_fault_site),
		H_TEST(test_reply_fail_fills_status_and_detail),
	};

	return H_RUN_SUITE("reply", NULL, NULL, tests);
}
