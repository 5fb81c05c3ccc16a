/*
 * Provider conformance, as an unmodified program against rdma-core 44's headers sees it
 * (tests/conformance.rs builds this and runs each case in a process of its own:
 * `conformance CASE`). Exits non-zero with a message on any mismatch.
 *
 *   two-contexts     two contexts on softverbs0 share the port: RC SEND/WRITE/READ/atomics
 *                    and UD between them, each addressing its peer with its own port's GID
 *                    or LID; honest attributes; cmd_fd; comp_vector
 *   many-contexts    250 contexts: one GID, one progress thread (and its counter writer),
 *                    little memory
 *   limits           EINVAL beyond the device's sizes, ENOMEM past the multicast groups
 *   nonblock         ibv_get_cq_event / ibv_get_async_event on O_NONBLOCK fds: EAGAIN
 *   signal           ... interrupted by a signal without SA_RESTART: EINTR
 *   destroy-waits    ibv_destroy_cq / ibv_destroy_qp wait for unacknowledged events
 *   no-stale-events  no event is delivered for a destroyed CQ or QP
 *   reg-mr           unmapped, read-only (for writing), empty and too large registrations
 *   num-sge          num_sge beyond the queue's max is refused before sg_list is read
 *   fork             a child's inherited context fails with EIO; the child opens its own
 *                    device; the parent's traffic is untouched
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <infiniband/verbs.h>

static const char *current_case = "?";

static void fail(int line, const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "conformance.c:%d [%s]: FAIL: ", line, current_case);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	exit(1);
}

#define CHECK(cond, ...)                                                       \
	do {                                                                   \
		if (!(cond))                                                   \
			fail(__LINE__, __VA_ARGS__);                           \
	} while (0)

#define QKEY 0x11111111u

static double now_s(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

static struct ibv_context *open_ctx(void)
{
	int n = 0;
	struct ibv_device **list = ibv_get_device_list(&n);
	struct ibv_context *ctx;

	CHECK(list && n == 1, "ibv_get_device_list: %d devices", n);
	ctx = ibv_open_device(list[0]);
	CHECK(ctx, "ibv_open_device: %s", strerror(errno));
	ibv_free_device_list(list);
	return ctx;
}

/* Polls one completion from cq (10 s at most). */
static struct ibv_wc poll_one(struct ibv_cq *cq)
{
	struct ibv_wc wc;
	double end = now_s() + 10;

	for (;;) {
		int n = ibv_poll_cq(cq, 1, &wc);

		CHECK(n >= 0, "ibv_poll_cq: %d", n);
		if (n == 1)
			return wc;
		CHECK(now_s() < end, "no completion within 10 s");
	}
}

static struct ibv_qp *make_qp(struct ibv_pd *pd, struct ibv_cq *cq, enum ibv_qp_type type)
{
	struct ibv_qp_init_attr a = {
		.send_cq = cq,
		.recv_cq = cq,
		.qp_type = type,
		.cap = { .max_send_wr = 64, .max_recv_wr = 64, .max_send_sge = 2,
			 .max_recv_sge = 2, .max_inline_data = 64 },
	};
	struct ibv_qp *qp = ibv_create_qp(pd, &a);

	CHECK(qp, "ibv_create_qp: %s", strerror(errno));
	return qp;
}

/* RESET -> INIT -> RTR -> RTS for an RC QP towards remote_qpn at `av`. */
static void connect_rc(struct ibv_qp *qp, uint32_t remote_qpn, struct ibv_ah_attr *av)
{
	struct ibv_qp_attr a = {
		.qp_state = IBV_QPS_INIT,
		.port_num = 1,
		.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
				   IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC,
	};

	CHECK(!ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
			     IBV_QP_ACCESS_FLAGS), "to INIT");
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = remote_qpn;
	a.rq_psn = 0;
	a.max_dest_rd_atomic = 4;
	a.min_rnr_timer = 1;
	a.ah_attr = *av;
	CHECK(!ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
			     IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
			     IBV_QP_MIN_RNR_TIMER), "to RTR");
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.sq_psn = 0;
	a.max_rd_atomic = 4;
	CHECK(!ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
			     IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC),
	      "to RTS");
}

static void ud_to_rts(struct ibv_qp *qp)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1, .qkey = QKEY };

	CHECK(!ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
			     IBV_QP_QKEY), "UD to INIT");
	a.qp_state = IBV_QPS_RTR;
	CHECK(!ibv_modify_qp(qp, &a, IBV_QP_STATE), "UD to RTR");
	a.qp_state = IBV_QPS_RTS;
	a.sq_psn = 0;
	CHECK(!ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN), "UD to RTS");
}

/* An address vector naming this context's own port: by GID or by LID. */
static struct ibv_ah_attr own_port(struct ibv_context *ctx, int by_gid)
{
	struct ibv_ah_attr av = { .port_num = 1 };
	struct ibv_port_attr pa;

	if (by_gid) {
		av.is_global = 1;
		av.grh.sgid_index = 0;
		av.grh.hop_limit = 64;
		CHECK(!ibv_query_gid(ctx, 1, 0, &av.grh.dgid), "ibv_query_gid");
	} else {
		CHECK(!ibv_query_port(ctx, 1, &pa), "ibv_query_port");
		CHECK(pa.lid != 0, "LID 0");
		av.dlid = pa.lid;
	}
	return av;
}

static void post_recv(struct ibv_qp *qp, uint64_t id, void *addr, uint32_t len, uint32_t lkey)
{
	struct ibv_sge sge = { (uintptr_t)addr, len, lkey };
	struct ibv_recv_wr wr = { .wr_id = id, .sg_list = &sge, .num_sge = 1 }, *bad;

	CHECK(!ibv_post_recv(qp, &wr, &bad), "ibv_post_recv");
}

static void post_rc(struct ibv_qp *qp, uint64_t id, enum ibv_wr_opcode op, void *addr,
		    uint32_t len, uint32_t lkey, uint64_t raddr, uint32_t rkey)
{
	struct ibv_sge sge = { (uintptr_t)addr, len, lkey };
	struct ibv_send_wr wr = {
		.wr_id = id, .sg_list = &sge, .num_sge = 1, .opcode = op,
		.send_flags = IBV_SEND_SIGNALED,
	}, *bad;

	if (op == IBV_WR_ATOMIC_CMP_AND_SWP || op == IBV_WR_ATOMIC_FETCH_AND_ADD) {
		wr.wr.atomic.remote_addr = raddr;
		wr.wr.atomic.rkey = rkey;
		wr.wr.atomic.compare_add = op == IBV_WR_ATOMIC_CMP_AND_SWP ? 5 : 10;
		wr.wr.atomic.swap = 77;
	} else {
		wr.wr.rdma.remote_addr = raddr;
		wr.wr.rdma.rkey = rkey;
	}
	CHECK(!ibv_post_send(qp, &wr, &bad), "ibv_post_send op %d", op);
}

/* ------------------------------------------------------------------------------------- */

static void case_two_contexts(void)
{
	struct ibv_context *c1 = open_ctx(), *c2 = open_ctx();
	union ibv_gid g1, g2;
	struct ibv_port_attr p1, p2;
	struct ibv_device_attr da;
	char *buf1, *buf2;
	struct ibv_pd *pd1, *pd2;
	struct ibv_mr *mr1, *mr2;
	struct ibv_cq *cq1, *cq2;
	struct ibv_qp *a, *b, *ua, *ub;
	struct ibv_ah_attr av;
	struct ibv_wc wc;
	uint64_t *word;
	int fd;

	/* One port: one GID and one LID, whatever the context. */
	CHECK(!ibv_query_gid(c1, 1, 0, &g1) && !ibv_query_gid(c2, 1, 0, &g2), "query_gid");
	CHECK(!memcmp(&g1, &g2, sizeof(g1)), "the contexts' GIDs differ");
	CHECK(!ibv_query_port(c1, 1, &p1) && !ibv_query_port(c2, 1, &p2), "query_port");
	CHECK(p1.lid == p2.lid && p1.lid != 0, "LIDs %u and %u", p1.lid, p2.lid);
	/* A standard RoCEv2 GID: ::ffff:a.b.c.d, what a peer rebuilds from an IPv4 address. */
	CHECK(g1.global.subnet_prefix == 0 &&
	      be64toh(g1.global.interface_id) >> 32 == 0x0000ffffu,
	      "not a standard IPv4-mapped GID");

	/* Honest attributes. */
	CHECK(!ibv_query_device(c1, &da), "query_device");
	CHECK(da.vendor_id == 0xffffff, "vendor_id %#x", da.vendor_id);
	CHECK(da.max_mcast_grp > 0 && da.max_mcast_qp_attach > 0 &&
	      da.max_total_mcast_qp_attach >= da.max_mcast_qp_attach,
	      "multicast limits %d %d %d", da.max_mcast_grp, da.max_mcast_qp_attach,
	      da.max_total_mcast_qp_attach);
	CHECK(c1->num_comp_vectors == 1, "num_comp_vectors %d", c1->num_comp_vectors);
	CHECK(c1->cmd_fd >= 0 && c1->cmd_fd != c2->cmd_fd, "cmd_fd %d %d", c1->cmd_fd,
	      c2->cmd_fd);
	fd = dup(c1->cmd_fd);
	CHECK(fd >= 0, "dup(cmd_fd): %s", strerror(errno));
	close(fd);
	CHECK(c1->async_fd >= 0 && c1->async_fd != c2->async_fd, "async fds");
	errno = 0;
	CHECK(!ibv_create_cq(c1, 8, NULL, NULL, 1) && errno == EINVAL,
	      "comp_vector 1 of 1: errno %d", errno);
	errno = 0;
	CHECK(!ibv_create_cq(c1, 8, NULL, NULL, -1) && errno == EINVAL,
	      "comp_vector -1: errno %d", errno);

	buf1 = aligned_alloc(4096, 65536);
	buf2 = aligned_alloc(4096, 65536);
	memset(buf1, 0, 65536);
	memset(buf2, 0, 65536);
	pd1 = ibv_alloc_pd(c1);
	pd2 = ibv_alloc_pd(c2);
	CHECK(pd1 && pd2, "alloc_pd");
	mr1 = ibv_reg_mr(pd1, buf1, 65536, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
			 IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC);
	mr2 = ibv_reg_mr(pd2, buf2, 65536, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
			 IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC);
	CHECK(mr1 && mr2, "reg_mr");
	cq1 = ibv_create_cq(c1, 64, NULL, NULL, 0);
	cq2 = ibv_create_cq(c2, 64, NULL, NULL, 0);
	CHECK(cq1 && cq2, "create_cq");

	/* RC: A (context 1) reaches B with its own port's GID, B reaches A with its LID. */
	a = make_qp(pd1, cq1, IBV_QPT_RC);
	b = make_qp(pd2, cq2, IBV_QPT_RC);
	CHECK(a->qp_num != b->qp_num, "one QPN space");
	av = own_port(c1, 1);
	connect_rc(a, b->qp_num, &av);
	av = own_port(c2, 0);
	connect_rc(b, a->qp_num, &av);

	strcpy(buf1, "send from A");
	post_recv(b, 1, buf2, 4096, mr2->lkey);
	post_rc(a, 2, IBV_WR_SEND, buf1, 12, mr1->lkey, 0, 0);
	wc = poll_one(cq1);
	CHECK(wc.status == IBV_WC_SUCCESS && wc.wr_id == 2, "SEND: %s",
	      ibv_wc_status_str(wc.status));
	wc = poll_one(cq2);
	CHECK(wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RECV && wc.byte_len == 12,
	      "RECV: %s len %u", ibv_wc_status_str(wc.status), wc.byte_len);
	CHECK(!strcmp(buf2, "send from A"), "SEND data");

	strcpy(buf2 + 1024, "write from B");
	post_rc(b, 3, IBV_WR_RDMA_WRITE, buf2 + 1024, 13, mr2->lkey,
		(uintptr_t)buf1 + 1024, mr1->rkey);
	wc = poll_one(cq2);
	CHECK(wc.status == IBV_WC_SUCCESS, "WRITE: %s", ibv_wc_status_str(wc.status));
	CHECK(!strcmp(buf1 + 1024, "write from B"), "WRITE data");

	strcpy(buf2 + 2048, "read by A");
	post_rc(a, 4, IBV_WR_RDMA_READ, buf1 + 2048, 10, mr1->lkey, (uintptr_t)buf2 + 2048,
		mr2->rkey);
	wc = poll_one(cq1);
	CHECK(wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RDMA_READ, "READ: %s",
	      ibv_wc_status_str(wc.status));
	CHECK(!strcmp(buf1 + 2048, "read by A"), "READ data");

	word = (uint64_t *)(buf2 + 4096);
	*word = 5;
	post_rc(a, 5, IBV_WR_ATOMIC_CMP_AND_SWP, buf1 + 4096, 8, mr1->lkey, (uintptr_t)word,
		mr2->rkey);
	wc = poll_one(cq1);
	CHECK(wc.status == IBV_WC_SUCCESS && *(uint64_t *)(buf1 + 4096) == 5 && *word == 77,
	      "CMP_SWAP: %s old %" PRIu64 " now %" PRIu64, ibv_wc_status_str(wc.status),
	      *(uint64_t *)(buf1 + 4096), *word);
	post_rc(b, 6, IBV_WR_ATOMIC_FETCH_AND_ADD, buf2 + 8192, 8, mr2->lkey,
		(uintptr_t)buf1 + 4096, mr1->rkey);
	wc = poll_one(cq2);
	CHECK(wc.status == IBV_WC_SUCCESS && *(uint64_t *)(buf2 + 8192) == 5 &&
	      *(uint64_t *)(buf1 + 4096) == 15, "FETCH_ADD: %s", ibv_wc_status_str(wc.status));

	/* UD: address handles from each context's own port (GID, then LID). */
	ua = make_qp(pd1, cq1, IBV_QPT_UD);
	ub = make_qp(pd2, cq2, IBV_QPT_UD);
	ud_to_rts(ua);
	ud_to_rts(ub);
	for (int by_gid = 1; by_gid >= 0; by_gid--) {
		struct ibv_ah_attr aa = own_port(c1, by_gid);
		struct ibv_ah *ah = ibv_create_ah(pd1, &aa), *back;
		struct ibv_sge sge = { (uintptr_t)buf1 + 16384, 8, mr1->lkey };
		struct ibv_send_wr wr = {
			.wr_id = 10, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND,
			.send_flags = IBV_SEND_SIGNALED,
		}, *bad;
		unsigned char *grh = (unsigned char *)buf2 + 16384;

		CHECK(ah, "create_ah (by %s): %s", by_gid ? "GID" : "LID", strerror(errno));
		wr.wr.ud.ah = ah;
		wr.wr.ud.remote_qpn = ub->qp_num;
		wr.wr.ud.remote_qkey = QKEY;
		memcpy(buf1 + 16384, "datagram", 8);
		post_recv(ub, 11, grh, 4096, mr2->lkey);
		CHECK(!ibv_post_send(ua, &wr, &bad), "UD post_send");
		wc = poll_one(cq1);
		CHECK(wc.status == IBV_WC_SUCCESS, "UD SEND: %s", ibv_wc_status_str(wc.status));
		wc = poll_one(cq2);
		CHECK(wc.status == IBV_WC_SUCCESS && wc.byte_len == 48 &&
		      (wc.wc_flags & IBV_WC_GRH) && wc.src_qp == ua->qp_num,
		      "UD RECV: %s len %u", ibv_wc_status_str(wc.status), wc.byte_len);
		CHECK(!memcmp(grh + 40, "datagram", 8), "UD data");
		/* The network header type where RoCE providers put it (UCX reads it): IPv4. */
		CHECK(wc.sl == 2, "wc.sl %u, not IPv4 (2)", wc.sl);
		CHECK(wc.slid == p1.lid, "wc.slid %u, not the sender's LID %u", wc.slid, p1.lid);
		/* The sender's GID rebuilt from the IPv4 header's source address, in the
		 * standard form, is the GID the sender's port reports (as UCX checks). */
		CHECK(grh[20] >> 4 == 4, "no IPv4 header in the GRH area");
		CHECK(!memcmp(grh + 20 + 12, &g1.raw[12], 4), "source address is not the GID's");
		back = ibv_create_ah_from_wc(pd2, &wc, (struct ibv_grh *)grh, 1);
		CHECK(back, "create_ah_from_wc: %s", strerror(errno));
		CHECK(!ibv_destroy_ah(back) && !ibv_destroy_ah(ah), "destroy_ah");
	}

	CHECK(!ibv_destroy_qp(a) && !ibv_destroy_qp(b) && !ibv_destroy_qp(ua) &&
	      !ibv_destroy_qp(ub), "destroy_qp");
	CHECK(!ibv_destroy_cq(cq1) && !ibv_destroy_cq(cq2), "destroy_cq");
	CHECK(!ibv_dereg_mr(mr1) && !ibv_dereg_mr(mr2), "dereg_mr");
	CHECK(!ibv_dealloc_pd(pd1) && !ibv_dealloc_pd(pd2), "dealloc_pd");
	CHECK(!ibv_close_device(c1) && !ibv_close_device(c2), "close_device");
	free(buf1);
	free(buf2);
}

/* Threads of this process (entries of /proc/self/task). */
static int threads(void)
{
	DIR *d = opendir("/proc/self/task");
	struct dirent *e;
	int n = 0;

	CHECK(d, "opendir /proc/self/task");
	while ((e = readdir(d)))
		n += e->d_name[0] != '.';
	closedir(d);
	return n;
}

/* Resident memory in KiB. */
static long rss_kib(void)
{
	long size, resident;
	FILE *f = fopen("/proc/self/statm", "r");

	CHECK(f && fscanf(f, "%ld %ld", &size, &resident) == 2, "statm");
	fclose(f);
	return resident * (sysconf(_SC_PAGESIZE) / 1024);
}

/* Many contexts share one device: one progress thread, little memory; closing the last
 * stops it. A device has two threads: the progress thread and the writer of its counter
 * file (which keeps file-system calls off the progress thread). */
static void case_many_contexts(void)
{
	enum { N = 250, DEVICE_THREADS = 2 };
	struct ibv_context *ctx[N];
	union ibv_gid first, g;
	int before = threads();
	long rss;

	ctx[0] = open_ctx();
	CHECK(threads() == before + DEVICE_THREADS, "one device's threads: %d -> %d", before,
	      threads());
	rss = rss_kib();
	CHECK(!ibv_query_gid(ctx[0], 1, 0, &first), "query_gid");
	for (int i = 1; i < N; i++) {
		ctx[i] = open_ctx();
		CHECK(!ibv_query_gid(ctx[i], 1, 0, &g) && !memcmp(&g, &first, sizeof(g)),
		      "context %d has another GID", i);
	}
	CHECK(threads() == before + DEVICE_THREADS, "%d contexts: %d threads, expected %d", N,
	      threads(), before + DEVICE_THREADS);
	CHECK(rss_kib() - rss < 64 * 1024, "%d contexts took %ld KiB", N, rss_kib() - rss);
	for (int i = 0; i < N; i++)
		CHECK(!ibv_close_device(ctx[i]), "close_device");
	CHECK(threads() == before, "the device's threads outlived the last context");
}

/* Limits fail with the kernel's errno: EINVAL for sizes beyond the device's, ENOMEM when a
 * resource runs out (the multicast groups, as rxe). */
static void case_limits(void)
{
	struct ibv_context *ctx = open_ctx();
	struct ibv_device_attr da;
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	struct ibv_cq *cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	struct ibv_qp *qp;
	struct ibv_qp_init_attr ia = { .send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_UD,
				       .cap = { 4, 4, 1, 1, 0 } };
	union ibv_gid mgid;
	int i;

	CHECK(pd && cq && !ibv_query_device(ctx, &da), "setup");
	errno = 0;
	CHECK(!ibv_create_cq(ctx, da.max_cqe + 1, NULL, NULL, 0) && errno == EINVAL,
	      "cqe beyond max_cqe: errno %d", errno);
	ia.cap.max_send_wr = da.max_qp_wr + 1;
	errno = 0;
	CHECK(!ibv_create_qp(pd, &ia) && errno == EINVAL, "max_send_wr beyond max_qp_wr: %d",
	      errno);
	ia.cap.max_send_wr = 4;
	ia.cap.max_send_sge = da.max_sge + 1;
	errno = 0;
	CHECK(!ibv_create_qp(pd, &ia) && errno == EINVAL, "max_send_sge beyond max_sge: %d",
	      errno);
	ia.cap.max_send_sge = 1;
	qp = ibv_create_qp(pd, &ia);
	CHECK(qp, "UD qp");
	ud_to_rts(qp);
	/* Groups of our own: 239.77.<pid>.<i>, UDP port in GID bytes 8-9. */
	memset(&mgid, 0, sizeof(mgid));
	mgid.raw[8] = 0x9c;
	mgid.raw[9] = 0x40 + getpid() % 64;
	mgid.raw[10] = mgid.raw[11] = 0xff;
	mgid.raw[12] = 239;
	mgid.raw[13] = 77;
	mgid.raw[14] = getpid() % 251;
	for (i = 0; i < da.max_mcast_grp; i++) {
		mgid.raw[15] = i;
		CHECK(!ibv_attach_mcast(qp, &mgid, 0), "attach group %d", i);
	}
	mgid.raw[15] = i;
	CHECK(ibv_attach_mcast(qp, &mgid, 0) == ENOMEM, "group %d beyond max_mcast_grp", i);
	for (i = 0; i < da.max_mcast_grp; i++) {
		mgid.raw[15] = i;
		CHECK(!ibv_detach_mcast(qp, &mgid, 0), "detach group %d", i);
	}
	CHECK(!ibv_destroy_qp(qp), "destroy_qp");
}

/* ------------------------------------------------------------------------------------- */

/* Two connected RC QPs of one context, B's receive CQ on a completion channel. */
struct pair {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_comp_channel *ch;
	struct ibv_cq *scq, *rcq;
	struct ibv_qp *a, *b;
	struct ibv_mr *mr;
	char *buf;
};

static void make_pair(struct pair *p)
{
	struct ibv_ah_attr av;

	p->ctx = open_ctx();
	p->pd = ibv_alloc_pd(p->ctx);
	p->ch = ibv_create_comp_channel(p->ctx);
	CHECK(p->pd && p->ch, "pd, channel");
	p->scq = ibv_create_cq(p->ctx, 64, NULL, NULL, 0);
	p->rcq = ibv_create_cq(p->ctx, 64, (void *)0x5eed, p->ch, 0);
	CHECK(p->scq && p->rcq, "cqs");
	{
		struct ibv_qp_init_attr ia = {
			.send_cq = p->scq, .recv_cq = p->scq, .qp_type = IBV_QPT_RC,
			.cap = { 16, 16, 1, 1, 0 },
		};
		p->a = ibv_create_qp(p->pd, &ia);
		ia.recv_cq = p->rcq;
		p->b = ibv_create_qp(p->pd, &ia);
		CHECK(p->a && p->b, "qps");
	}
	av = own_port(p->ctx, 1);
	connect_rc(p->a, p->b->qp_num, &av);
	connect_rc(p->b, p->a->qp_num, &av);
	p->buf = aligned_alloc(4096, 8192);
	memset(p->buf, 0, 8192);
	p->mr = ibv_reg_mr(p->pd, p->buf, 8192, IBV_ACCESS_LOCAL_WRITE |
			   IBV_ACCESS_REMOTE_WRITE);
	CHECK(p->mr, "reg_mr");
}

/* A SEND from A to B; B's receive CQ is armed first, so its channel fires. */
static void fire_cq_event(struct pair *p)
{
	struct ibv_wc wc;

	CHECK(!ibv_req_notify_cq(p->rcq, 0), "req_notify_cq");
	post_recv(p->b, 1, p->buf + 4096, 1024, p->mr->lkey);
	post_rc(p->a, 2, IBV_WR_SEND, p->buf, 16, p->mr->lkey, 0, 0);
	wc = poll_one(p->scq);
	CHECK(wc.status == IBV_WC_SUCCESS, "SEND: %s", ibv_wc_status_str(wc.status));
}

/* A WRITE from A with a bad rkey: B's QP gets an access error (an async event). */
static void fire_async_event(struct pair *p)
{
	struct ibv_wc wc;

	post_rc(p->a, 3, IBV_WR_RDMA_WRITE, p->buf, 8, p->mr->lkey, (uintptr_t)p->buf,
		p->mr->rkey ^ 0x100);
	wc = poll_one(p->scq);
	CHECK(wc.status == IBV_WC_REM_ACCESS_ERR, "bad-rkey WRITE: %s",
	      ibv_wc_status_str(wc.status));
}

static void set_nonblock(int fd)
{
	int flags = fcntl(fd, F_GETFL);

	CHECK(flags >= 0 && fcntl(fd, F_SETFL, flags | O_NONBLOCK) == 0, "O_NONBLOCK");
}

static int readable(int fd, int ms)
{
	struct pollfd p = { fd, POLLIN, 0 };

	return poll(&p, 1, ms) == 1;
}

/* Takes async events until one that is not PORT_ACTIVE (the port came up when the first
 * context opened). */
static int next_async(struct ibv_context *ctx, struct ibv_async_event *ev)
{
	int r;

	do {
		r = ibv_get_async_event(ctx, ev);
	} while (r == 0 && ev->event_type == IBV_EVENT_PORT_ACTIVE);
	return r;
}

static void case_nonblock(void)
{
	struct pair p;
	struct ibv_cq *cq;
	void *cq_ctx;
	struct ibv_async_event ev;
	double t;

	make_pair(&p);
	set_nonblock(p.ch->fd);
	set_nonblock(p.ctx->async_fd);
	/* Nothing pending: -1 with read()'s errno, at once (no spinning). */
	t = now_s();
	errno = 0;
	CHECK(ibv_get_cq_event(p.ch, &cq, &cq_ctx) == -1 && errno == EAGAIN,
	      "get_cq_event on an empty O_NONBLOCK channel: errno %d", errno);
	errno = 0;
	CHECK(next_async(p.ctx, &ev) == -1 && errno == EAGAIN,
	      "get_async_event on an empty O_NONBLOCK fd: errno %d", errno);
	CHECK(now_s() - t < 5, "EAGAIN took %.1f s", now_s() - t);
	/* An event arrives: the fd becomes readable and the call returns it. */
	fire_cq_event(&p);
	CHECK(readable(p.ch->fd, 10000), "channel fd never readable");
	CHECK(ibv_get_cq_event(p.ch, &cq, &cq_ctx) == 0 && cq == p.rcq &&
	      cq_ctx == (void *)0x5eed, "get_cq_event");
	ibv_ack_cq_events(cq, 1);
	CHECK(!readable(p.ch->fd, 0), "channel fd readable with nothing pending");
	errno = 0;
	CHECK(ibv_get_cq_event(p.ch, &cq, &cq_ctx) == -1 && errno == EAGAIN, "EAGAIN again");
	fire_async_event(&p);
	CHECK(readable(p.ctx->async_fd, 10000), "async fd never readable");
	CHECK(next_async(p.ctx, &ev) == 0 && ev.event_type == IBV_EVENT_QP_ACCESS_ERR &&
	      ev.element.qp == p.b, "async event %d", ev.event_type);
	ibv_ack_async_event(&ev);
	errno = 0;
	CHECK(next_async(p.ctx, &ev) == -1 && errno == EAGAIN, "async EAGAIN again");
}

static volatile sig_atomic_t alarms;

static void on_alarm(int sig)
{
	(void)sig;
	alarms++;
}

static void case_signal(void)
{
	struct pair p;
	struct ibv_cq *cq;
	void *cq_ctx;
	struct ibv_async_event ev;
	struct sigaction sa;
	struct itimerval it = { { 0, 0 }, { 0, 200000 } };

	make_pair(&p);
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_alarm;
	sigemptyset(&sa.sa_mask);
	sa.sa_flags = 0; /* no SA_RESTART: the wait must end */
	CHECK(!sigaction(SIGALRM, &sa, NULL), "sigaction");
	/* Blocking fds, nothing will come: the alarm interrupts the wait. */
	CHECK(!setitimer(ITIMER_REAL, &it, NULL), "setitimer");
	errno = 0;
	CHECK(ibv_get_cq_event(p.ch, &cq, &cq_ctx) == -1 && errno == EINTR,
	      "get_cq_event: errno %d", errno);
	CHECK(alarms == 1, "alarms %d", (int)alarms);
	CHECK(!setitimer(ITIMER_REAL, &it, NULL), "setitimer");
	errno = 0;
	CHECK(next_async(p.ctx, &ev) == -1 && errno == EINTR, "get_async_event: errno %d",
	      errno);
	CHECK(alarms == 2, "alarms %d", (int)alarms);
}

/* ------------------------------------------------------------------------------------- */

struct destroyer {
	int (*destroy)(void *);
	void *obj;
	volatile int done;
	int ret;
};

static int destroy_cq(void *o) { return ibv_destroy_cq(o); }
static int destroy_qp(void *o) { return ibv_destroy_qp(o); }

static void *destroy_thread(void *arg)
{
	struct destroyer *d = arg;

	d->ret = d->destroy(d->obj);
	__atomic_store_n(&d->done, 1, __ATOMIC_RELEASE);
	return NULL;
}

/* Destroys `obj` on a thread; the call must still be waiting after a while (an event of it
 * is unacknowledged), and return once `ack` runs. */
static void destroy_waits_for(int (*destroy)(void *), void *obj, void (*ack)(void *),
			      void *ack_arg, const char *what)
{
	struct destroyer d = { destroy, obj, 0, -1 };
	pthread_t t;

	CHECK(!pthread_create(&t, NULL, destroy_thread, &d), "pthread_create");
	usleep(300000);
	CHECK(!__atomic_load_n(&d.done, __ATOMIC_ACQUIRE),
	      "%s returned with an event unacknowledged", what);
	ack(ack_arg);
	CHECK(!pthread_join(t, NULL), "pthread_join");
	CHECK(d.ret == 0, "%s: %d", what, d.ret);
}

static void ack_cq(void *cq) { ibv_ack_cq_events(cq, 1); }
static void ack_async(void *ev) { ibv_ack_async_event(ev); }

static void case_destroy_waits(void)
{
	struct pair p;
	struct ibv_cq *cq;
	void *cq_ctx;
	struct ibv_async_event ev;

	make_pair(&p);
	/* An async event of QP B, taken and not acknowledged: destroying B waits. */
	fire_async_event(&p);
	CHECK(next_async(p.ctx, &ev) == 0 && ev.event_type == IBV_EVENT_QP_ACCESS_ERR &&
	      ev.element.qp == p.b, "async event");
	destroy_waits_for(destroy_qp, p.b, ack_async, &ev, "ibv_destroy_qp");
	/* A completion event of the receive CQ (QP A's SEND lands on... B is gone: use a new
	 * QP on the receive CQ). */
	{
		struct ibv_qp_init_attr ia = {
			.send_cq = p.scq, .recv_cq = p.rcq, .qp_type = IBV_QPT_RC,
			.cap = { 16, 16, 1, 1, 0 },
		};
		struct ibv_ah_attr av = own_port(p.ctx, 1);
		struct ibv_qp *a2 = ibv_create_qp(p.pd, &ia), *b2 = ibv_create_qp(p.pd, &ia);

		CHECK(a2 && b2, "qps");
		connect_rc(a2, b2->qp_num, &av);
		connect_rc(b2, a2->qp_num, &av);
		p.a = a2;
		p.b = b2;
	}
	fire_cq_event(&p);
	CHECK(ibv_get_cq_event(p.ch, &cq, &cq_ctx) == 0 && cq == p.rcq, "get_cq_event");
	/* The CQ is busy while QPs use it; without them, destroying it waits for the ack. */
	CHECK(ibv_destroy_cq(p.rcq) == EBUSY, "destroy_cq while used: not EBUSY");
	CHECK(!ibv_destroy_qp(p.a) && !ibv_destroy_qp(p.b), "destroy qps");
	destroy_waits_for(destroy_cq, p.rcq, ack_cq, p.rcq, "ibv_destroy_cq");
	CHECK(!ibv_destroy_comp_channel(p.ch), "destroy_comp_channel");
}

static void case_no_stale_events(void)
{
	struct pair p;
	struct ibv_cq *cq;
	void *cq_ctx;
	struct ibv_async_event ev;

	make_pair(&p);
	set_nonblock(p.ch->fd);
	set_nonblock(p.ctx->async_fd);
	/* Drain PORT_ACTIVE, if this context brought the port up. */
	errno = 0;
	CHECK(next_async(p.ctx, &ev) == -1 && errno == EAGAIN, "async events pending");
	/* An async event of B pending (not taken); destroying B drops it. */
	fire_async_event(&p);
	CHECK(readable(p.ctx->async_fd, 10000), "the access error never came");
	CHECK(!ibv_destroy_qp(p.b), "destroy_qp");
	CHECK(!readable(p.ctx->async_fd, 0), "async fd readable after the QP was destroyed");
	errno = 0;
	CHECK(next_async(p.ctx, &ev) == -1 && errno == EAGAIN,
	      "an event of a destroyed QP was delivered (type %d)", ev.event_type);
	/* A completion event pending on the channel; destroying the CQ drops it. */
	{
		struct ibv_qp_init_attr ia = {
			.send_cq = p.scq, .recv_cq = p.rcq, .qp_type = IBV_QPT_RC,
			.cap = { 16, 16, 1, 1, 0 },
		};
		struct ibv_ah_attr av = own_port(p.ctx, 1);
		struct ibv_qp *b2 = ibv_create_qp(p.pd, &ia);
		struct ibv_qp *a2 = ibv_create_qp(p.pd, &ia);

		CHECK(a2 && b2, "qps");
		connect_rc(a2, b2->qp_num, &av);
		connect_rc(b2, a2->qp_num, &av);
		CHECK(!ibv_destroy_qp(p.a), "destroy_qp");
		p.a = a2;
		p.b = b2;
	}
	fire_cq_event(&p);
	CHECK(readable(p.ch->fd, 10000), "the CQ event never came");
	CHECK(!ibv_destroy_qp(p.a) && !ibv_destroy_qp(p.b), "destroy qps");
	CHECK(!ibv_destroy_cq(p.rcq), "destroy_cq");
	CHECK(!readable(p.ch->fd, 0), "channel fd readable after its CQ was destroyed");
	errno = 0;
	CHECK(ibv_get_cq_event(p.ch, &cq, &cq_ctx) == -1 && errno == EAGAIN,
	      "an event of a destroyed CQ was delivered");
}

/* ------------------------------------------------------------------------------------- */

static void case_reg_mr(void)
{
	struct ibv_context *ctx = open_ctx();
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	long page = sysconf(_SC_PAGESIZE);
	char *map = mmap(NULL, 3 * page, PROT_READ | PROT_WRITE,
			 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	struct ibv_mr *mr;
	size_t big = (size_t)1 << 40; /* 1 TiB */
	char *huge;
	struct ibv_device_attr da;

	CHECK(pd && map != MAP_FAILED, "pd, mmap");
	CHECK(!mprotect(map + page, page, PROT_READ), "mprotect");
	CHECK(!munmap(map + 2 * page, page), "munmap");
	/* Mapped and writable: fine. */
	mr = ibv_reg_mr(pd, map, page, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	CHECK(mr, "writable page: %s", strerror(errno));
	CHECK(!ibv_dereg_mr(mr), "dereg");
	/* Read-only: fine for remote reads, EFAULT when the region could be written. */
	mr = ibv_reg_mr(pd, map + page, page, IBV_ACCESS_REMOTE_READ);
	CHECK(mr, "read-only page for reading: %s", strerror(errno));
	CHECK(!ibv_dereg_mr(mr), "dereg");
	static const int writes[] = { IBV_ACCESS_LOCAL_WRITE,
				      IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE,
				      IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_ATOMIC };
	for (unsigned i = 0; i < sizeof(writes) / sizeof(writes[0]); i++) {
		errno = 0;
		CHECK(!ibv_reg_mr(pd, map + page, page, writes[i]) && errno == EFAULT,
		      "read-only page, access %#x: errno %d", writes[i], errno);
	}
	errno = 0;
	CHECK(!ibv_reg_mr(pd, map, 2 * page, IBV_ACCESS_LOCAL_WRITE) && errno == EFAULT,
	      "half read-only range: errno %d", errno);
	/* Unmapped: EFAULT, for any access. */
	errno = 0;
	CHECK(!ibv_reg_mr(pd, map + 2 * page, page, IBV_ACCESS_REMOTE_READ) && errno == EFAULT,
	      "unmapped page: errno %d", errno);
	errno = 0;
	CHECK(!ibv_reg_mr(pd, map + page, 2 * page, 0) && errno == EFAULT,
	      "range running into unmapped memory: errno %d", errno);
	errno = 0;
	CHECK(!ibv_reg_mr(pd, (void *)0x1000, page, 0) && errno == EFAULT,
	      "address 0x1000: errno %d", errno);
	/* Empty. */
	errno = 0;
	CHECK(!ibv_reg_mr(pd, map, 0, IBV_ACCESS_LOCAL_WRITE) && errno == EINVAL,
	      "length 0: errno %d", errno);
	/* Beyond the cap on registered bytes (the test sets SOFTVERBS_MAX_MR_BYTES; mapped
	 * but never touched, so it costs nothing): ENOMEM. */
	CHECK(!ibv_query_device(ctx, &da), "query_device");
	CHECK(da.max_mr_size < big, "max_mr_size %" PRIu64, (uint64_t)da.max_mr_size);
	huge = mmap(NULL, big, PROT_READ | PROT_WRITE,
		    MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	CHECK(huge != MAP_FAILED, "mmap 1 TiB");
	errno = 0;
	CHECK(!ibv_reg_mr(pd, huge, big, IBV_ACCESS_LOCAL_WRITE) && errno == ENOMEM,
	      "1 TiB: errno %d", errno);
	/* What fits still registers. */
	mr = ibv_reg_mr(pd, huge, 1 << 20, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	CHECK(mr, "1 MiB of it: %s", strerror(errno));
	CHECK(!ibv_dereg_mr(mr), "dereg");
	munmap(huge, big);
	munmap(map, 2 * page);
}

static void case_num_sge(void)
{
	struct pair p;
	struct ibv_sge sge = { 0, 8, 0 };
	struct ibv_send_wr swr = { .wr_id = 1, .sg_list = NULL, .num_sge = 1000000,
				   .opcode = IBV_WR_SEND }, *sbad = NULL;
	struct ibv_recv_wr rwr = { .wr_id = 2, .sg_list = NULL, .num_sge = 1000000 },
			   *rbad = NULL;
	struct ibv_srq_init_attr sa = { .attr = { .max_wr = 4, .max_sge = 1 } };
	struct ibv_srq *srq;
	struct ibv_wc wc;

	make_pair(&p);
	sge.addr = (uintptr_t)p.buf;
	sge.lkey = p.mr->lkey;
	/* num_sge 1e6 with a NULL list: refused without reading the list. */
	CHECK(ibv_post_send(p.a, &swr, &sbad) == EINVAL && sbad == &swr, "post_send 1e6");
	CHECK(ibv_post_recv(p.b, &rwr, &rbad) == EINVAL && rbad == &rwr, "post_recv 1e6");
	swr.num_sge = -1;
	CHECK(ibv_post_send(p.a, &swr, &sbad) == EINVAL, "post_send -1");
	/* One more than the QP's max_send_sge (1), pointing at one valid SGE. */
	swr.sg_list = &sge;
	swr.num_sge = 2;
	CHECK(ibv_post_send(p.a, &swr, &sbad) == EINVAL && sbad == &swr, "post_send 2 > 1");
	srq = ibv_create_srq(p.pd, &sa);
	CHECK(srq, "create_srq");
	rwr.num_sge = 1000000;
	rbad = NULL;
	CHECK(ibv_post_srq_recv(srq, &rwr, &rbad) == EINVAL && rbad == &rwr, "srq 1e6");
	/* A list whose second WR is bad: the first is posted, bad_wr names the second. */
	{
		struct ibv_send_wr w2 = { .wr_id = 3, .num_sge = 99, .opcode = IBV_WR_SEND };
		struct ibv_send_wr w1 = { .wr_id = 4, .next = &w2, .sg_list = &sge, .num_sge = 1,
					  .opcode = IBV_WR_SEND,
					  .send_flags = IBV_SEND_SIGNALED };

		post_recv(p.b, 5, p.buf + 4096, 1024, p.mr->lkey);
		sbad = NULL;
		CHECK(ibv_post_send(p.a, &w1, &sbad) == EINVAL && sbad == &w2, "list");
		wc = poll_one(p.scq);
		CHECK(wc.wr_id == 4 && wc.status == IBV_WC_SUCCESS, "first WR of the list");
	}
	/* The QP still works. */
	CHECK(!ibv_destroy_srq(srq), "destroy_srq");
}

/* ------------------------------------------------------------------------------------- */

/* UD datagrams from a QP to itself: all `n` must arrive. */
static void ud_burst(struct ibv_context *ctx, int n)
{
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	struct ibv_cq *cq = ibv_create_cq(ctx, 2 * n, NULL, NULL, 0);
	struct ibv_qp_init_attr qa = {
		.qp_type = IBV_QPT_UD,
		.cap = { .max_send_wr = n, .max_recv_wr = n, .max_send_sge = 1,
			 .max_recv_sge = 1 },
	};
	struct ibv_qp *qp;
	char *buf = aligned_alloc(4096, 256 * 128);
	struct ibv_mr *mr;
	struct ibv_ah_attr aa;
	struct ibv_ah *ah;
	int sent = 0, got = 0;

	CHECK(pd && cq && buf, "pd, cq, buf");
	mr = ibv_reg_mr(pd, buf, 256 * 128, IBV_ACCESS_LOCAL_WRITE);
	CHECK(mr, "reg_mr");
	qa.send_cq = qa.recv_cq = cq;
	qp = ibv_create_qp(pd, &qa);
	CHECK(qp, "create UD qp: %s", strerror(errno));
	ud_to_rts(qp);
	aa = own_port(ctx, 1);
	ah = ibv_create_ah(pd, &aa);
	CHECK(ah, "create_ah");
	for (int i = 0; i < n; i++)
		post_recv(qp, 1000 + i, buf + (i % 64) * 128, 128, mr->lkey);
	for (int i = 0; i < n; i++) {
		struct ibv_sge sge = { (uintptr_t)buf + 200 * 128, 16, mr->lkey };
		struct ibv_send_wr wr = { .wr_id = i, .sg_list = &sge, .num_sge = 1,
					  .opcode = IBV_WR_SEND,
					  .send_flags = IBV_SEND_SIGNALED }, *bad;

		wr.wr.ud.ah = ah;
		wr.wr.ud.remote_qpn = qp->qp_num;
		wr.wr.ud.remote_qkey = QKEY;
		CHECK(!ibv_post_send(qp, &wr, &bad), "UD post_send");
	}
	while (sent + got < 2 * n) {
		struct ibv_wc wc = poll_one(cq);

		CHECK(wc.status == IBV_WC_SUCCESS, "UD: %s", ibv_wc_status_str(wc.status));
		if (wc.opcode == IBV_WC_RECV)
			got++;
		else
			sent++;
	}
	ibv_destroy_ah(ah);
	ibv_destroy_qp(qp);
	ibv_dereg_mr(mr);
	ibv_destroy_cq(cq);
	ibv_dealloc_pd(pd);
	free(buf);
}

static void case_fork(void)
{
	struct pair p;
	union ibv_gid parent_gid;
	int to_child[2], from_child[2];
	pid_t pid;
	int status;
	char c;

	CHECK(ibv_fork_init() == 0, "ibv_fork_init");
	CHECK(ibv_is_fork_initialized() == IBV_FORK_UNNEEDED, "ibv_is_fork_initialized %d",
	      ibv_is_fork_initialized());
	make_pair(&p);
	CHECK(!ibv_query_gid(p.ctx, 1, 0, &parent_gid), "query_gid");
	CHECK(!pipe(to_child) && !pipe(from_child), "pipe");
	pid = fork();
	CHECK(pid >= 0, "fork");
	if (pid == 0) {
		close(to_child[1]);
		close(from_child[0]);
		/* The child: every call on the inherited context and its objects fails with
		 * EIO at once (no deadlock on the parent's locks). */
		struct ibv_send_wr wr = { .opcode = IBV_WR_SEND }, *bad;
		struct ibv_recv_wr rwr = { 0 }, *rbad;
		struct ibv_async_event ev;
		struct ibv_cq *cq;
		void *cq_ctx;
		struct ibv_wc wc;
		struct ibv_context *mine;
		union ibv_gid gid;
		struct ibv_device_attr da;

		current_case = "fork (child)";
		errno = 0;
		CHECK(!ibv_alloc_pd(p.ctx) && errno == EIO, "alloc_pd: errno %d", errno);
		errno = 0;
		CHECK(!ibv_create_cq(p.ctx, 4, NULL, NULL, 0) && errno == EIO, "create_cq");
		CHECK(ibv_query_device(p.ctx, &da) == EIO, "query_device");
		CHECK(ibv_post_send(p.a, &wr, &bad) == EIO, "post_send");
		CHECK(ibv_post_recv(p.b, &rwr, &rbad) == EIO, "post_recv");
		CHECK(ibv_poll_cq(p.scq, 1, &wc) < 0, "poll_cq");
		CHECK(ibv_req_notify_cq(p.rcq, 0) == EIO, "req_notify_cq");
		errno = 0;
		CHECK(ibv_get_async_event(p.ctx, &ev) == -1 && errno == EIO, "get_async_event");
		errno = 0;
		CHECK(ibv_get_cq_event(p.ch, &cq, &cq_ctx) == -1 && errno == EIO,
		      "get_cq_event");
		CHECK(ibv_destroy_qp(p.a) == EIO, "destroy_qp");
		CHECK(ibv_dereg_mr(p.mr) == EIO, "dereg_mr");
		/* It opens a device of its own, with a different endpoint, which works. */
		mine = open_ctx();
		CHECK(!ibv_query_gid(mine, 1, 0, &gid), "query_gid");
		CHECK(memcmp(&gid, &parent_gid, sizeof(gid)), "the child got the parent's GID");
		ud_burst(mine, 100);
		CHECK(!ibv_close_device(mine), "close own device");
		CHECK(!ibv_close_device(p.ctx), "close inherited device");
		/* Stay alive while the parent uses its device. */
		CHECK(write(from_child[1], "k", 1) == 1, "write");
		CHECK(read(to_child[0], &c, 1) == 1, "read");
		_exit(0);
	}
	close(to_child[0]);
	close(from_child[1]);
	CHECK(read(from_child[0], &c, 1) == 1, "the child failed");
	/* The parent, with the child alive: its device works and the child reads none of
	 * its datagrams (UD: a stolen one would be missing). */
	fire_cq_event(&p);
	ud_burst(p.ctx, 200);
	CHECK(write(to_child[1], "k", 1) == 1, "write");
	CHECK(waitpid(pid, &status, 0) == pid, "waitpid");
	CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child status %d", status);
	fire_async_event(&p);
}

int main(int argc, char **argv)
{
	static const struct {
		const char *name;
		void (*run)(void);
	} cases[] = {
		{ "two-contexts", case_two_contexts },
		{ "many-contexts", case_many_contexts },
		{ "limits", case_limits },
		{ "nonblock", case_nonblock },
		{ "signal", case_signal },
		{ "destroy-waits", case_destroy_waits },
		{ "no-stale-events", case_no_stale_events },
		{ "reg-mr", case_reg_mr },
		{ "num-sge", case_num_sge },
		{ "fork", case_fork },
	};

	setvbuf(stdout, NULL, _IONBF, 0);
	for (unsigned i = 0; argc == 2 && i < sizeof(cases) / sizeof(cases[0]); i++) {
		if (!strcmp(argv[1], cases[i].name)) {
			current_case = cases[i].name;
			cases[i].run();
			printf("conformance %s: ok\n", current_case);
			return 0;
		}
	}
	fprintf(stderr, "usage: %s CASE\n", argv[0]);
	return 2;
}
