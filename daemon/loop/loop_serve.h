/* loop_serve.h - what loop_serve.c offers the loop's other files: serving a connection's
 * frames, deferred replies and the ready list's connections. */
#pragma once
#include "loop_server.h"

/* Serves p's complete frames (up to its budget) and sends the turn's replies. false when p is
 * closing: the caller must not touch it any more. */
bool kvp_loop_serve(struct server *sv, struct peer *p);
/* The defers' deliver hook (defer.h, ctx the server): sends r to t's session if still served;
 * false when it is not. */
bool kvp_loop_serve_deferred(void *ctx, const struct kvp_defer *t, struct kvp_reply *r, int code);
/* p, taken off the ready list: served and armed again, or freed when closing. */
void kvp_loop_serve_look_again(struct server *sv, struct peer *p);
