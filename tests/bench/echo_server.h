/* echo_server.h - the io_uring frame echo server bench_rpc_throughput compares kvpoold with. */
#pragma once

/* Serves connections accepted on the listening unix socket lfd forever, echoing every complete
 * frame back. Returns -1 only on a setup or ring failure. */
int echo_server_run(int lfd);
