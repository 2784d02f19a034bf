/* snapshot.h - a pool's books in a memfd that outlives kvpoold (the fd store keeps it with the
 * tier memory, fdstore.h): page states, the token tree's and the key cache's entries, and at a
 * clean stop the leases of the sessions that may resume. A restarted kvpoold adopts the memory
 * and rebuilds the books from it when they prove consistent; otherwise the pool starts empty.
 *
 * Consistency (the guard): the memfd's first page is a header kept mapped, with two generation
 * counters. A checkpoint bumps gen_dirty, writes the body, its length and CRC32C, then sets
 * gen_clean = gen_dirty and arms the pool's page allocators (kvp_pages_guard): the first cached
 * page to leave the cache afterwards (evicted, demoted, flushed, upgraded) bumps gen_dirty
 * before anything can reuse it. So after a crash, gen_clean == gen_dirty proves that every page
 * the checkpoint lists as cached still holds what it held: the cache is adopted (pages cached
 * since the checkpoint come back free). gen_clean != gen_dirty (a cached page went, or the crash
 * hit a checkpoint being written), a bad CRC, version or geometry fingerprint: the pool starts
 * empty, one log line says why. Leases and sessions are restored only from a checkpoint written
 * at a clean stop (clean_stop = 1, cleared once the new kvpoold runs): after a crash they are in
 * doubt and their pages are freed. Before a checkpoint bumps gen_dirty, the memfd grows to
 * half as much again as the last books (its pages allocated: writing the mapping cannot fault
 * for memory): when it cannot, the previous checkpoint stays valid if this kvpoold wrote it and
 * its guard still holds, and the next tick tries again. Books that grew by more than half since
 * grow on while they are written; failing that, there are none until a later tick writes
 * them. Periodic checkpoints are written by a forked copy of kvpoold (snapshot.c: the loop
 * begins the generation, arms the guard and forks; the copy encodes the books as they were at
 * the fork and seals that generation), so the loop does not wait for the walk. */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct kvp_daemon;
struct kvp_session;
struct kvpd_pool;
struct kvp_pool_conf;
struct kvp_snap;

/* Creates (through create, which logs its failure) or adopts every configured pool: one whose
 * memory and books the fd store handed back with the same fingerprint is adopted and its books
 * rebuilt (or started empty when they are in doubt); one whose fingerprint changed is created
 * afresh (the stored one released). Then every pool's fds go to the fd store. 0, or -1 (a pool
 * could not be made: logged). */
int kvp_snap_start_pools(struct kvp_daemon *d,
			 struct kvpd_pool *(*create)(const struct kvp_pool_conf *pc, uint32_t id,
						     char *why, size_t whylen));
/* Whether pool pc will be adopted from the fd store (its memory is in use already: the budget
 * check leaves it out). */
bool kvp_snap_adoptable(const struct kvp_pool_conf *pc);
/* A new pool's books (pools a reload creates): a fresh memfd, fds to the fd store. 0 or -errno
 * (the pool then runs without restarts). */
int kvp_snap_attach(struct kvpd_pool *p);
/* Writes every pool's checkpoint; clean_stop: with the sessions that may resume (kvpoold
 * stops). */
void kvp_snap_write_all(struct kvp_daemon *d, bool clean_stop);
/* Once per loop tick: checkpoints that are due, sessions whose resume grace ended. */
void kvp_snap_tick(struct kvp_daemon *d, uint64_t now_ms);
/* Draws s's resume token; with tok (len bytes) from a Hello that names a session of the
 * previous kvpoold of the same uid still waiting, moves its leases and locks to s. Returns 1
 * resumed, 0 not. */
int kvp_snap_hello(struct kvp_daemon *d, struct kvp_session *s, const uint8_t *tok, size_t len);
/* Accepts NULL. Unmaps and closes (the fd store keeps its copy). */
void kvp_snap_free(struct kvp_snap *s);
