/*
 * The extended verbs through rdma-core 44's header inlines, on softverbs (tests/extended.rs
 * builds and runs this): ibv_create_cq_ex with start/next/end_poll and the ibv_wc_read_*
 * readers, ibv_create_qp_ex with send_ops_flags and the ibv_wr_* post-send API, on two RC
 * QPs of one context over loopback (and two UD QPs, and memory windows). Exits non-zero
 * with a message on any mismatch.
 */
#include <endian.h>
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <infiniband/verbs.h>

static void fail(int line, const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "extended.c:%d: FAIL: ", line);
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

struct comp {
	uint64_t wr_id;
	int status;
	int opcode;
	uint32_t byte_len;
	uint32_t imm;
	unsigned int wc_flags;
	uint32_t qp_num;
	uint32_t src_qp;
	uint64_t ts;
};

struct pcq {
	struct ibv_cq_ex *cq;
	uint64_t last_ts;
	const char *name;
};

static double now_s(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

/* Reads the current completion of c through the cq_ex readers. */
static void read_one(struct pcq *c, struct comp *o)
{
	struct ibv_cq_ex *cq = c->cq;

	o->wr_id = cq->wr_id;
	o->status = cq->status;
	o->opcode = ibv_wc_read_opcode(cq);
	o->byte_len = ibv_wc_read_byte_len(cq);
	o->wc_flags = ibv_wc_read_wc_flags(cq);
	o->imm = (o->wc_flags & IBV_WC_WITH_IMM) ? ibv_wc_read_imm_data(cq) : 0;
	o->qp_num = ibv_wc_read_qp_num(cq);
	o->src_qp = ibv_wc_read_src_qp(cq);
	o->ts = ibv_wc_read_completion_ts(cq);
	CHECK(o->ts != 0, "%s: completion timestamp is 0", c->name);
	CHECK(o->ts >= c->last_ts, "%s: timestamp went back: %" PRIu64 " < %" PRIu64,
	      c->name, o->ts, c->last_ts);
	c->last_ts = o->ts;
	CHECK(o->status == IBV_WC_SUCCESS, "%s: wr_id %" PRIu64 " status %d (%s)", c->name,
	      o->wr_id, o->status, ibv_wc_status_str(o->status));
}

/* Takes exactly n completions with start_poll/next_poll/end_poll (10 s at most). */
static void poll_n(struct pcq *c, int n, struct comp *out)
{
	double end = now_s() + 10;
	int got = 0;

	while (got < n) {
		struct ibv_poll_cq_attr attr = { .comp_mask = 0 };
		int rc = ibv_start_poll(c->cq, &attr);

		if (rc == ENOENT) {
			CHECK(now_s() < end, "%s: only %d of %d completions", c->name, got, n);
			continue;
		}
		CHECK(rc == 0, "%s: start_poll returned %d", c->name, rc);
		for (;;) {
			read_one(c, &out[got++]);
			if (got == n)
				break;
			rc = ibv_next_poll(c->cq);
			if (rc == ENOENT)
				break;
			CHECK(rc == 0, "%s: next_poll returned %d", c->name, rc);
		}
		ibv_end_poll(c->cq);
	}
}

/* Waits a little and checks that c stays empty. */
static void expect_empty(struct pcq *c)
{
	struct ibv_poll_cq_attr attr = { .comp_mask = 0 };
	int rc;

	usleep(200 * 1000);
	rc = ibv_start_poll(c->cq, &attr);
	if (rc == 0) {
		struct comp x;

		read_one(c, &x);
		ibv_end_poll(c->cq);
		fail(__LINE__, "%s: unexpected completion wr_id %" PRIu64 " opcode %d", c->name,
		     x.wr_id, x.opcode);
	}
	CHECK(rc == ENOENT, "%s: start_poll on an empty CQ returned %d", c->name, rc);
}

static void expect_comp(const struct comp *c, uint64_t wr_id, int opcode, uint32_t byte_len,
			uint32_t qp_num, const char *what)
{
	CHECK(c->wr_id == wr_id, "%s: wr_id %" PRIu64 ", want %" PRIu64, what, c->wr_id, wr_id);
	CHECK(c->opcode == opcode, "%s: opcode %d, want %d", what, c->opcode, opcode);
	CHECK(byte_len == (uint32_t)-1 || c->byte_len == byte_len, "%s: byte_len %u, want %u",
	      what, c->byte_len, byte_len);
	CHECK(c->qp_num == qp_num, "%s: qp_num %u, want %u", what, c->qp_num, qp_num);
}

static void modify(struct ibv_qp *qp, struct ibv_qp_attr *a, int mask, const char *what)
{
	int rc = ibv_modify_qp(qp, a, mask);

	CHECK(rc == 0, "modify_qp to %s: %d", what, rc);
}

static void connect_qp(struct ibv_qp *qp, uint32_t dest_qpn, uint16_t dlid, union ibv_gid *gid)
{
	struct ibv_qp_attr a;

	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_INIT;
	a.pkey_index = 0;
	a.port_num = 1;
	a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
			    IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
	modify(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS,
	       "INIT");

	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = dest_qpn;
	a.rq_psn = 0;
	a.max_dest_rd_atomic = 4;
	a.min_rnr_timer = 12;
	a.ah_attr.port_num = 1;
	if (gid) {
		a.ah_attr.is_global = 1;
		a.ah_attr.grh.dgid = *gid;
		a.ah_attr.grh.sgid_index = 0;
		a.ah_attr.grh.hop_limit = 1;
	} else {
		a.ah_attr.dlid = dlid;
	}
	modify(qp, &a,
	       IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
		       IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER,
	       "RTR");

	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.sq_psn = 0;
	a.max_rd_atomic = 4;
	modify(qp, &a,
	       IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
		       IBV_QP_MAX_QP_RD_ATOMIC,
	       "RTS");
}

static void post_recv(struct ibv_qp *qp, struct ibv_mr *mr, char *addr, uint32_t len,
		      uint64_t wr_id)
{
	struct ibv_sge sge = { .addr = (uintptr_t)addr, .length = len, .lkey = mr->lkey };
	struct ibv_recv_wr wr = { .wr_id = wr_id, .sg_list = &sge, .num_sge = 1 };
	struct ibv_recv_wr *bad = NULL;

	CHECK(ibv_post_recv(qp, &wr, &bad) == 0, "post_recv");
}

static struct ibv_qp *create_qp_ex(struct ibv_context *ctx, struct ibv_pd *pd,
				   struct ibv_cq_ex *cq, uint32_t extra_mask, uint64_t ops,
				   uint32_t create_flags)
{
	struct ibv_qp_init_attr_ex a;

	memset(&a, 0, sizeof(a));
	a.send_cq = ibv_cq_ex_to_cq(cq);
	a.recv_cq = ibv_cq_ex_to_cq(cq);
	a.qp_type = IBV_QPT_RC;
	a.cap.max_send_wr = 32;
	a.cap.max_recv_wr = 32;
	a.cap.max_send_sge = 4;
	a.cap.max_recv_sge = 1;
	a.cap.max_inline_data = 64;
	a.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS | extra_mask;
	a.pd = pd;
	a.send_ops_flags = ops;
	a.create_flags = create_flags;
	a.max_tso_header = 64;
	return ibv_create_qp_ex(ctx, &a);
}

int main(void)
{
	const uint64_t wc_flags = IBV_WC_EX_WITH_BYTE_LEN | IBV_WC_EX_WITH_IMM |
				  IBV_WC_EX_WITH_QP_NUM | IBV_WC_EX_WITH_SRC_QP |
				  IBV_WC_EX_WITH_COMPLETION_TIMESTAMP;
	const uint64_t ops = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM |
			     IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_READ |
			     IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP |
			     IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD;
	const int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
			   IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
	struct ibv_device **list;
	struct ibv_context *ctx;
	struct ibv_device_attr_ex dx;
	struct ibv_port_attr port;
	union ibv_gid gid;
	struct ibv_pd *pd;
	struct ibv_comp_channel *ch;
	struct ibv_cq_init_attr_ex cqa;
	struct pcq ca = { .name = "cq A" }, cb = { .name = "cq B" };
	struct ibv_qp *a, *b, *plain;
	struct ibv_qp_ex *qa;
	struct ibv_mr *mra, *mrb;
	struct comp c[8];
	char *bufa, *bufb;
	uint64_t v;
	int n, rc;

	alarm(60);
	list = ibv_get_device_list(&n);
	CHECK(list && n >= 1, "no device");
	ctx = ibv_open_device(list[0]);
	CHECK(ctx, "open_device");
	ibv_free_device_list(list);

	memset(&dx, 0, sizeof(dx));
	CHECK(ibv_query_device_ex(ctx, NULL, &dx) == 0, "query_device_ex");
	CHECK(dx.completion_timestamp_mask != 0, "completion_timestamp_mask is 0");
	CHECK(dx.hca_core_clock != 0, "hca_core_clock is 0");
	CHECK(ibv_query_port(ctx, 1, &port) == 0, "query_port");
	CHECK(ibv_query_gid(ctx, 1, 0, &gid) == 0, "query_gid");

	pd = ibv_alloc_pd(ctx);
	CHECK(pd, "alloc_pd");
	bufa = aligned_alloc(4096, 4096);
	bufb = aligned_alloc(4096, 4096);
	CHECK(bufa && bufb, "malloc");
	memset(bufa, 0, 4096);
	memset(bufb, 0, 4096);
	mra = ibv_reg_mr(pd, bufa, 4096, access);
	mrb = ibv_reg_mr(pd, bufb, 4096, access | IBV_ACCESS_MW_BIND);
	CHECK(mra && mrb, "reg_mr");
	ch = ibv_create_comp_channel(ctx);
	CHECK(ch, "create_comp_channel");

	/* Unsupported completion fields are refused. */
	memset(&cqa, 0, sizeof(cqa));
	cqa.cqe = 16;
	cqa.wc_flags = wc_flags | IBV_WC_EX_WITH_FLOW_TAG;
	errno = 0;
	CHECK(!ibv_create_cq_ex(ctx, &cqa) && errno == EOPNOTSUPP,
	      "create_cq_ex with FLOW_TAG: errno %d", errno);

	cqa.wc_flags = wc_flags;
	ca.cq = ibv_create_cq_ex(ctx, &cqa);
	cqa.channel = ch;
	cqa.cq_context = &cb;
	cb.cq = ibv_create_cq_ex(ctx, &cqa);
	CHECK(ca.cq && cb.cq, "create_cq_ex: errno %d", errno);
	{
		struct ibv_poll_cq_attr pa = { .comp_mask = 0 };

		CHECK(ibv_start_poll(ca.cq, &pa) == ENOENT, "start_poll on a new CQ");
	}

	/* Unsupported QP extensions are refused. */
	errno = 0;
	CHECK(!create_qp_ex(ctx, pd, ca.cq, IBV_QP_INIT_ATTR_CREATE_FLAGS, ops,
			    IBV_QP_CREATE_SCATTER_FCS) && errno == EOPNOTSUPP,
	      "create_flags: errno %d", errno);
	errno = 0;
	CHECK(!create_qp_ex(ctx, pd, ca.cq, IBV_QP_INIT_ATTR_MAX_TSO_HEADER, ops, 0) &&
		      errno == EOPNOTSUPP,
	      "max_tso_header: errno %d", errno);
	errno = 0;
	CHECK(!create_qp_ex(ctx, pd, ca.cq, 0, ops | IBV_QP_EX_WITH_TSO, 0) && errno == EOPNOTSUPP,
	      "TSO on RC: errno %d", errno);

	a = create_qp_ex(ctx, pd, ca.cq, IBV_QP_INIT_ATTR_CREATE_FLAGS, ops, 0);
	b = create_qp_ex(ctx, pd, cb.cq, 0,
			 ops | IBV_QP_EX_WITH_BIND_MW | IBV_QP_EX_WITH_LOCAL_INV, 0);
	CHECK(a && b, "create_qp_ex: errno %d", errno);
	qa = ibv_qp_to_qp_ex(a);
	CHECK(qa == (struct ibv_qp_ex *)a, "qp_to_qp_ex");
	CHECK(qa->wr_start && qa->wr_complete && qa->wr_abort && qa->wr_send &&
		      qa->wr_set_sge && qa->wr_set_ud_addr && qa->wr_atomic_write,
	      "ibv_qp_ex ops missing");

	/* A QP made without send_ops_flags has no ibv_qp_ex (as rdma-core). */
	{
		struct ibv_qp_init_attr pa;

		memset(&pa, 0, sizeof(pa));
		pa.send_cq = pa.recv_cq = ibv_cq_ex_to_cq(ca.cq);
		pa.qp_type = IBV_QPT_RC;
		pa.cap.max_send_wr = pa.cap.max_recv_wr = 1;
		pa.cap.max_send_sge = pa.cap.max_recv_sge = 1;
		plain = ibv_create_qp(pd, &pa);
		CHECK(plain, "create_qp");
		CHECK(!ibv_qp_to_qp_ex(plain), "qp_to_qp_ex of a plain QP");
		CHECK(ibv_destroy_qp(plain) == 0, "destroy plain QP");
	}

	/* A by LID, B by GID. */
	connect_qp(a, b->qp_num, port.lid, NULL);
	connect_qp(b, a->qp_num, 0, &gid);

	/* Batch 1: SEND (sge), SEND_WITH_IMM (sge list), SEND (inline), RDMA WRITE. */
	post_recv(b, mrb, bufb + 0, 256, 100);
	post_recv(b, mrb, bufb + 256, 256, 101);
	post_recv(b, mrb, bufb + 512, 256, 102);
	memcpy(bufa, "hello", 5);
	memcpy(bufa + 16, "abc", 3);
	memcpy(bufa + 32, "defg", 4);
	memcpy(bufa + 64, "0123456789abcdef", 16);
	{
		char inl[32] = "inline-data";
		struct ibv_sge two[2] = {
			{ .addr = (uintptr_t)(bufa + 16), .length = 3, .lkey = mra->lkey },
			{ .addr = (uintptr_t)(bufa + 32), .length = 4, .lkey = mra->lkey },
		};

		ibv_wr_start(qa);
		qa->wr_id = 1;
		qa->wr_flags = IBV_SEND_SIGNALED;
		ibv_wr_send(qa);
		ibv_wr_set_sge(qa, mra->lkey, (uintptr_t)bufa, 5);
		qa->wr_id = 2;
		qa->wr_flags = IBV_SEND_SIGNALED;
		ibv_wr_send_imm(qa, htobe32(0xdeadbeef));
		ibv_wr_set_sge_list(qa, 2, two);
		qa->wr_id = 3;
		qa->wr_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
		ibv_wr_send(qa);
		ibv_wr_set_inline_data(qa, inl, 11);
		memset(inl, 'X', sizeof(inl)); /* inline data is copied when set */
		qa->wr_id = 4;
		qa->wr_flags = IBV_SEND_SIGNALED;
		ibv_wr_rdma_write(qa, mrb->rkey, (uintptr_t)(bufb + 1024));
		ibv_wr_set_sge(qa, mra->lkey, (uintptr_t)(bufa + 64), 16);
		rc = ibv_wr_complete(qa);
		CHECK(rc == 0, "batch 1 wr_complete: %d", rc);
	}
	poll_n(&ca, 4, c);
	expect_comp(&c[0], 1, IBV_WC_SEND, (uint32_t)-1, a->qp_num, "send");
	expect_comp(&c[1], 2, IBV_WC_SEND, (uint32_t)-1, a->qp_num, "send_imm");
	expect_comp(&c[2], 3, IBV_WC_SEND, (uint32_t)-1, a->qp_num, "send inline");
	expect_comp(&c[3], 4, IBV_WC_RDMA_WRITE, (uint32_t)-1, a->qp_num, "rdma write");
	poll_n(&cb, 3, c);
	expect_comp(&c[0], 100, IBV_WC_RECV, 5, b->qp_num, "recv 1");
	expect_comp(&c[1], 101, IBV_WC_RECV, 7, b->qp_num, "recv 2");
	expect_comp(&c[2], 102, IBV_WC_RECV, 11, b->qp_num, "recv 3");
	for (n = 0; n < 3; n++)
		CHECK(c[n].src_qp == a->qp_num, "recv %d: src_qp %u, want %u", n, c[n].src_qp,
		      a->qp_num);
	CHECK(!(c[0].wc_flags & IBV_WC_WITH_IMM), "recv 1 has IBV_WC_WITH_IMM");
	CHECK(c[1].wc_flags & IBV_WC_WITH_IMM, "recv 2 lacks IBV_WC_WITH_IMM");
	CHECK(c[1].imm == htobe32(0xdeadbeef), "imm %#x", be32toh(c[1].imm));
	CHECK(!memcmp(bufb, "hello", 5), "recv 1 data");
	CHECK(!memcmp(bufb + 256, "abcdefg", 7), "recv 2 data (sge list)");
	CHECK(!memcmp(bufb + 512, "inline-data", 11), "recv 3 data (inline): %.11s", bufb + 512);
	CHECK(!memcmp(bufb + 1024, "0123456789abcdef", 16), "rdma write data");

	/* Batch 2: RDMA READ and atomics. */
	v = 100;
	memcpy(bufb + 2048, &v, 8);
	v = 7;
	memcpy(bufb + 2056, &v, 8);
	memset(bufa + 128, 0, 256);
	ibv_wr_start(qa);
	qa->wr_id = 5;
	qa->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_rdma_read(qa, mrb->rkey, (uintptr_t)(bufb + 1024));
	ibv_wr_set_sge(qa, mra->lkey, (uintptr_t)(bufa + 128), 16);
	qa->wr_id = 6;
	qa->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_atomic_fetch_add(qa, mrb->rkey, (uintptr_t)(bufb + 2048), 5);
	ibv_wr_set_sge(qa, mra->lkey, (uintptr_t)(bufa + 256), 8);
	qa->wr_id = 7;
	qa->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_atomic_cmp_swp(qa, mrb->rkey, (uintptr_t)(bufb + 2056), 7, 42);
	ibv_wr_set_sge(qa, mra->lkey, (uintptr_t)(bufa + 264), 8);
	qa->wr_id = 8;
	qa->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_atomic_cmp_swp(qa, mrb->rkey, (uintptr_t)(bufb + 2056), 7, 99);
	ibv_wr_set_sge(qa, mra->lkey, (uintptr_t)(bufa + 272), 8);
	rc = ibv_wr_complete(qa);
	CHECK(rc == 0, "batch 2 wr_complete: %d", rc);
	poll_n(&ca, 4, c);
	expect_comp(&c[0], 5, IBV_WC_RDMA_READ, 16, a->qp_num, "rdma read");
	expect_comp(&c[1], 6, IBV_WC_FETCH_ADD, 8, a->qp_num, "fetch_add");
	expect_comp(&c[2], 7, IBV_WC_COMP_SWAP, 8, a->qp_num, "cmp_swp 1");
	expect_comp(&c[3], 8, IBV_WC_COMP_SWAP, 8, a->qp_num, "cmp_swp 2");
	CHECK(!memcmp(bufa + 128, "0123456789abcdef", 16), "rdma read data");
	memcpy(&v, bufa + 256, 8);
	CHECK(v == 100, "fetch_add returned %" PRIu64 ", want 100", v);
	memcpy(&v, bufb + 2048, 8);
	CHECK(v == 105, "after fetch_add: %" PRIu64 ", want 105", v);
	memcpy(&v, bufa + 264, 8);
	CHECK(v == 7, "cmp_swp 1 returned %" PRIu64 ", want 7", v);
	memcpy(&v, bufa + 272, 8);
	CHECK(v == 42, "cmp_swp 2 returned %" PRIu64 ", want 42", v);
	memcpy(&v, bufb + 2056, 8);
	CHECK(v == 42, "after cmp_swp: %" PRIu64 ", want 42", v);

	/* Batch 3: wr_abort posts nothing. */
	post_recv(b, mrb, bufb + 768, 256, 103);
	memcpy(bufa + 512, "ZZZZ", 4);
	ibv_wr_start(qa);
	qa->wr_id = 9;
	qa->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_send(qa);
	ibv_wr_set_sge(qa, mra->lkey, (uintptr_t)bufa, 5);
	qa->wr_id = 10;
	qa->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_rdma_write(qa, mrb->rkey, (uintptr_t)(bufb + 3000));
	ibv_wr_set_sge(qa, mra->lkey, (uintptr_t)(bufa + 512), 4);
	ibv_wr_abort(qa);
	expect_empty(&ca);
	expect_empty(&cb);
	CHECK(bufb[3000] == 0, "aborted RDMA WRITE landed");

	/* Batch 4: a failing builder or setter posts nothing of its batch. */
	ibv_wr_start(qa);
	qa->wr_id = 11;
	qa->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_send(qa);
	ibv_wr_set_sge(qa, mra->lkey, (uintptr_t)bufa, 5);
	ibv_wr_set_xrc_srqn(qa, 1);
	rc = ibv_wr_complete(qa);
	CHECK(rc == EOPNOTSUPP, "set_xrc_srqn batch: wr_complete %d", rc);
	ibv_wr_start(qa);
	ibv_wr_set_sge(qa, mra->lkey, (uintptr_t)bufa, 5);
	rc = ibv_wr_complete(qa);
	CHECK(rc == EINVAL, "setter without a builder: wr_complete %d", rc);
	expect_empty(&ca);
	expect_empty(&cb);

	/* Batch 5: an unsignaled SEND, then an RDMA WRITE of an inline list; the receive
	 * shows up through ibv_poll_cq and a completion channel on the cq_ex. */
	CHECK(ibv_req_notify_cq(ibv_cq_ex_to_cq(cb.cq), 0) == 0, "req_notify_cq");
	{
		struct ibv_data_buf bufs[2] = { { .addr = "in", .length = 2 },
						{ .addr = "list", .length = 4 } };
		struct ibv_cq *ev_cq = NULL;
		void *ev_ctx = NULL;
		struct ibv_wc wc;
		double end;

		ibv_wr_start(qa);
		qa->wr_id = 12;
		qa->wr_flags = 0;
		ibv_wr_send(qa);
		ibv_wr_set_sge(qa, mra->lkey, (uintptr_t)bufa, 5);
		qa->wr_id = 13;
		qa->wr_flags = IBV_SEND_SIGNALED;
		ibv_wr_rdma_write(qa, mrb->rkey, (uintptr_t)(bufb + 3000));
		ibv_wr_set_inline_data_list(qa, 2, bufs);
		rc = ibv_wr_complete(qa);
		CHECK(rc == 0, "batch 5 wr_complete: %d", rc);
		poll_n(&ca, 1, c);
		expect_comp(&c[0], 13, IBV_WC_RDMA_WRITE, (uint32_t)-1, a->qp_num,
			    "write after unsignaled send");
		CHECK(!memcmp(bufb + 3000, "inlist", 6), "inline list write data");

		CHECK(ibv_get_cq_event(ch, &ev_cq, &ev_ctx) == 0, "get_cq_event");
		CHECK(ev_cq == ibv_cq_ex_to_cq(cb.cq) && ev_ctx == &cb, "event CQ/context");
		ibv_ack_cq_events(ev_cq, 1);
		end = now_s() + 10;
		while ((n = ibv_poll_cq(ibv_cq_ex_to_cq(cb.cq), 1, &wc)) == 0)
			CHECK(now_s() < end, "ibv_poll_cq on a cq_ex: nothing");
		CHECK(n == 1 && wc.status == IBV_WC_SUCCESS && wc.wr_id == 103 &&
			      wc.opcode == IBV_WC_RECV && wc.byte_len == 5 &&
			      wc.qp_num == b->qp_num && wc.src_qp == a->qp_num,
		      "ibv_poll_cq: n %d status %d wr_id %" PRIu64 " opcode %d len %u", n,
		      wc.status, wc.wr_id, wc.opcode, wc.byte_len);
	}
	expect_empty(&ca);
	expect_empty(&cb);

	/* UD through the ibv_qp_ex API: wr_set_ud_addr with an address handle. */
	{
		const uint32_t qkey = 0x11111111;
		struct ibv_qp *ua, *ub;
		struct ibv_qp_ex *qu;
		struct ibv_qp_init_attr_ex ia;
		struct ibv_qp_attr at;
		struct ibv_ah_attr aha;
		struct ibv_ah *ah;
		struct ibv_qp *uq[2];
		int i;

		memset(&ia, 0, sizeof(ia));
		ia.send_cq = ibv_cq_ex_to_cq(ca.cq);
		ia.recv_cq = ibv_cq_ex_to_cq(cb.cq);
		ia.qp_type = IBV_QPT_UD;
		ia.cap.max_send_wr = ia.cap.max_recv_wr = 8;
		ia.cap.max_send_sge = ia.cap.max_recv_sge = 1;
		ia.cap.max_inline_data = 64;
		ia.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
		ia.pd = pd;
		ia.send_ops_flags = IBV_QP_EX_WITH_RDMA_WRITE;
		errno = 0;
		CHECK(!ibv_create_qp_ex(ctx, &ia) && errno == EOPNOTSUPP,
		      "RDMA WRITE on UD: errno %d", errno);
		ia.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM;
		ua = ibv_create_qp_ex(ctx, &ia);
		ub = ibv_create_qp_ex(ctx, &ia);
		CHECK(ua && ub, "create UD QPs: errno %d", errno);
		uq[0] = ua;
		uq[1] = ub;
		for (i = 0; i < 2; i++) {
			memset(&at, 0, sizeof(at));
			at.qp_state = IBV_QPS_INIT;
			at.port_num = 1;
			at.qkey = qkey;
			modify(uq[i], &at,
			       IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY,
			       "UD INIT");
			memset(&at, 0, sizeof(at));
			at.qp_state = IBV_QPS_RTR;
			modify(uq[i], &at, IBV_QP_STATE, "UD RTR");
			memset(&at, 0, sizeof(at));
			at.qp_state = IBV_QPS_RTS;
			modify(uq[i], &at, IBV_QP_STATE | IBV_QP_SQ_PSN, "UD RTS");
		}
		memset(&aha, 0, sizeof(aha));
		aha.is_global = 1;
		aha.grh.dgid = gid;
		aha.grh.sgid_index = 0;
		aha.port_num = 1;
		ah = ibv_create_ah(pd, &aha);
		CHECK(ah, "create_ah: errno %d", errno);
		post_recv(ub, mrb, bufb + 3072, 40 + 64, 200);
		qu = ibv_qp_to_qp_ex(ua);
		CHECK(qu, "qp_to_qp_ex of a UD QP");
		/* Without wr_set_ud_addr the batch fails and posts nothing. */
		ibv_wr_start(qu);
		qu->wr_id = 19;
		qu->wr_flags = IBV_SEND_SIGNALED;
		ibv_wr_send(qu);
		ibv_wr_set_inline_data(qu, "nowhere", 7);
		rc = ibv_wr_complete(qu);
		CHECK(rc == EINVAL, "UD send without an address: wr_complete %d", rc);
		ibv_wr_start(qu);
		qu->wr_id = 20;
		qu->wr_flags = IBV_SEND_SIGNALED;
		ibv_wr_send_imm(qu, htobe32(7));
		ibv_wr_set_ud_addr(qu, ah, ub->qp_num, qkey);
		ibv_wr_set_inline_data(qu, "datagram", 8);
		rc = ibv_wr_complete(qu);
		CHECK(rc == 0, "UD wr_complete: %d", rc);
		poll_n(&ca, 1, c);
		expect_comp(&c[0], 20, IBV_WC_SEND, (uint32_t)-1, ua->qp_num, "UD send");
		poll_n(&cb, 1, c);
		expect_comp(&c[0], 200, IBV_WC_RECV, 40 + 8, ub->qp_num, "UD recv");
		CHECK(c[0].src_qp == ua->qp_num, "UD src_qp %u, want %u", c[0].src_qp, ua->qp_num);
		CHECK((c[0].wc_flags & IBV_WC_WITH_IMM) && c[0].imm == htobe32(7), "UD imm");
		CHECK(!memcmp(bufb + 3072 + 40, "datagram", 8), "UD data");
		expect_empty(&ca);
		expect_empty(&cb);
		CHECK(ibv_destroy_qp(ua) == 0 && ibv_destroy_qp(ub) == 0, "destroy UD QPs");
		CHECK(ibv_destroy_ah(ah) == 0, "destroy_ah");
	}

	/* Memory windows: type 2 bound with ibv_wr_bind_mw and invalidated with
	 * ibv_wr_local_inv, type 1 bound with ibv_bind_mw; A writes through them. */
	{
		struct ibv_qp_ex *qb = ibv_qp_to_qp_ex(b);
		struct ibv_mw *mw2 = ibv_alloc_mw(pd, IBV_MW_TYPE_2);
		struct ibv_mw *mw1 = ibv_alloc_mw(pd, IBV_MW_TYPE_1);
		struct ibv_mw_bind_info bi = { .mr = mrb, .addr = (uintptr_t)(bufb + 3584),
					       .length = 256,
					       .mw_access_flags = IBV_ACCESS_REMOTE_WRITE };
		struct ibv_mw_bind mb = { .wr_id = 31, .send_flags = IBV_SEND_SIGNALED };
		uint32_t rkey2;

		CHECK(qb && mw2 && mw1, "alloc_mw: errno %d", errno);
		CHECK(mw2->type == IBV_MW_TYPE_2 && mw2->pd == pd, "mw fields");
		CHECK(ibv_dealloc_pd(pd) == EBUSY, "dealloc_pd with windows");
		rkey2 = ibv_inc_rkey(mw2->rkey);
		ibv_wr_start(qb);
		qb->wr_id = 30;
		qb->wr_flags = IBV_SEND_SIGNALED;
		ibv_wr_bind_mw(qb, mw2, rkey2, &bi);
		rc = ibv_wr_complete(qb);
		CHECK(rc == 0, "bind_mw wr_complete: %d", rc);
		poll_n(&cb, 1, c);
		expect_comp(&c[0], 30, IBV_WC_BIND_MW, (uint32_t)-1, b->qp_num, "bind_mw");
		mw2->rkey = rkey2;

		/* Type 1 windows are not bound by work requests. */
		ibv_wr_start(qb);
		qb->wr_id = 32;
		ibv_wr_bind_mw(qb, mw1, ibv_inc_rkey(mw1->rkey), &bi);
		rc = ibv_wr_complete(qb);
		CHECK(rc == EINVAL, "wr_bind_mw of a type 1 window: %d", rc);

		mb.bind_info = bi;
		mb.bind_info.addr = (uintptr_t)(bufb + 3840);
		rc = ibv_bind_mw(b, mw1, &mb);
		CHECK(rc == 0, "ibv_bind_mw: %d", rc);
		poll_n(&cb, 1, c);
		expect_comp(&c[0], 31, IBV_WC_BIND_MW, (uint32_t)-1, b->qp_num, "bind_mw type 1");

		ibv_wr_start(qa);
		qa->wr_id = 33;
		qa->wr_flags = IBV_SEND_SIGNALED;
		ibv_wr_rdma_write(qa, mw2->rkey, (uintptr_t)(bufb + 3584 + 8));
		ibv_wr_set_inline_data(qa, "window2", 7);
		qa->wr_id = 34;
		ibv_wr_rdma_write(qa, mw1->rkey, (uintptr_t)(bufb + 3840));
		ibv_wr_set_inline_data(qa, "window1", 7);
		rc = ibv_wr_complete(qa);
		CHECK(rc == 0, "writes through windows: %d", rc);
		poll_n(&ca, 2, c);
		expect_comp(&c[0], 33, IBV_WC_RDMA_WRITE, (uint32_t)-1, a->qp_num, "write mw2");
		expect_comp(&c[1], 34, IBV_WC_RDMA_WRITE, (uint32_t)-1, a->qp_num, "write mw1");
		CHECK(!memcmp(bufb + 3584 + 8, "window2", 7), "data through mw2");
		CHECK(!memcmp(bufb + 3840, "window1", 7), "data through mw1");

		ibv_wr_start(qb);
		qb->wr_id = 35;
		qb->wr_flags = IBV_SEND_SIGNALED;
		ibv_wr_local_inv(qb, mw2->rkey);
		rc = ibv_wr_complete(qb);
		CHECK(rc == 0, "local_inv wr_complete: %d", rc);
		poll_n(&cb, 1, c);
		expect_comp(&c[0], 35, IBV_WC_LOCAL_INV, (uint32_t)-1, b->qp_num, "local_inv");
		CHECK(ibv_dealloc_mw(mw1) == 0 && ibv_dealloc_mw(mw2) == 0, "dealloc_mw");

		/* The invalidated window's rkey no longer works (this moves A to the error
		 * state, so it comes last). */
		ibv_wr_start(qa);
		qa->wr_id = 36;
		qa->wr_flags = IBV_SEND_SIGNALED;
		ibv_wr_rdma_write(qa, rkey2, (uintptr_t)(bufb + 3584));
		ibv_wr_set_inline_data(qa, "late", 4);
		rc = ibv_wr_complete(qa);
		CHECK(rc == 0, "write through an invalidated window: wr_complete %d", rc);
		{
			struct ibv_poll_cq_attr pa = { .comp_mask = 0 };
			double end = now_s() + 20;

			while ((rc = ibv_start_poll(ca.cq, &pa)) == ENOENT)
				CHECK(now_s() < end, "no completion for the write to an invalid key");
			CHECK(rc == 0, "start_poll %d", rc);
			CHECK(ca.cq->wr_id == 36 && ca.cq->status == IBV_WC_REM_ACCESS_ERR,
			      "write to an invalid key: wr_id %" PRIu64 " status %d (%s)",
			      ca.cq->wr_id, ca.cq->status, ibv_wc_status_str(ca.cq->status));
			ibv_end_poll(ca.cq);
		}
		CHECK(memcmp(bufb + 3584, "late", 4), "write through an invalidated window landed");
	}

	CHECK(ibv_destroy_qp(a) == 0 && ibv_destroy_qp(b) == 0, "destroy_qp");
	CHECK(ibv_destroy_cq(ibv_cq_ex_to_cq(ca.cq)) == 0, "destroy cq A");
	CHECK(ibv_destroy_cq(ibv_cq_ex_to_cq(cb.cq)) == 0, "destroy cq B");
	CHECK(ibv_destroy_comp_channel(ch) == 0, "destroy_comp_channel");
	CHECK(ibv_dereg_mr(mra) == 0 && ibv_dereg_mr(mrb) == 0, "dereg_mr");
	CHECK(ibv_dealloc_pd(pd) == 0, "dealloc_pd");
	CHECK(ibv_close_device(ctx) == 0, "close_device");
	free(bufa);
	free(bufb);
	printf("extended verbs: ok\n");
	return 0;
}
