//! The connection-manager calls of the drop-in `librdmacm.so.1` from a C program built as
//! rdma-core applications are (installed headers, rdma-core's link libraries), one process
//! with a client and a server id: options (`REUSEADDR`, `TOS`, `ACK_TIMEOUT`, a wrong
//! length), an `O_NONBLOCK` channel driven by `poll`, `id->route` / `id->verbs` /
//! `id->port_num` after resolution, `rdma_create_qp` on the id's PD, `rdma_init_qp_attr`,
//! connect / accept with private data, the QP moved to RTS with the ACK timeout the option
//! asked for, `rdma_migrate_id` of a connected id, disconnect, and `rdma_destroy_id` waiting
//! for the event the program still holds (destroy semantics of rdma_destroy_id(3)). A
//! second program forks a peer that exits without destroying its ids, as programs may
//! since the kernel destroys them when the process's rdma_cm file closes.
//!
//! Needs `cc`, librdmacm-dev and `cargo build --workspace`; skips loudly without the first
//! two, or fails when `SOFTVERBS_REQUIRE_TOOLS=1` (CI).

mod common;

use common::{
    build_program, can_build_programs, dropin, run_on, run_on_under_memcheck, tools_present,
    C_PRELUDE,
};

const PROGRAM: &str = r#"
#include <pthread.h>

/* The next event on `ch`, waiting with poll() when the channel is non-blocking. */
static struct rdma_cm_event *next(struct rdma_event_channel *ch) {
    struct rdma_cm_event *ev = NULL;
    for (int i = 0; i < 200; i++) {
        if (rdma_get_cm_event(ch, &ev) == 0)
            return ev;
        if (errno != EAGAIN) {
            printf("get_cm_event: %s\n", e(errno));
            exit(1);
        }
        struct pollfd p = { .fd = ch->fd, .events = POLLIN };
        poll(&p, 1, 100);
    }
    printf("no event\n");
    exit(1);
}

static int expect(struct rdma_event_channel *ch, enum rdma_cm_event_type type,
                  struct rdma_cm_event **out) {
    struct rdma_cm_event *ev = next(ch);
    printf("%s status %d\n", rdma_event_str(ev->event), ev->status);
    if (ev->event != type)
        exit(1);
    if (out) {
        *out = ev;
        return 0;
    }
    return rdma_ack_cm_event(ev);
}

static volatile int acked;
static void *ack_later(void *arg) {
    usleep(200000);
    acked = 1;
    rdma_ack_cm_event(arg);
    return NULL;
}

int main(void) {
    setvbuf(stdout, NULL, _IONBF, 0);
    struct rdma_event_channel *sch = rdma_create_event_channel();
    struct rdma_event_channel *cch = rdma_create_event_channel();
    struct rdma_cm_id *listen_id, *cid, *sid;
    struct rdma_cm_event *ev;

    SHOW("create_listen", rdma_create_id(sch, &listen_id, NULL, RDMA_PS_TCP));
    int one = 1;
    SHOW("reuseaddr", rdma_set_option(listen_id, RDMA_OPTION_ID, RDMA_OPTION_ID_REUSEADDR,
                                      &one, sizeof one));
    SHOW("reuseaddr_short", rdma_set_option(listen_id, RDMA_OPTION_ID,
                                            RDMA_OPTION_ID_REUSEADDR, &one, 1));
    struct sockaddr_in sin = { .sin_family = AF_INET,
                               .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    SHOW("bind", rdma_bind_addr(listen_id, (struct sockaddr *)&sin));
    SHOW("listen", rdma_listen(listen_id, 4));
    sin.sin_port = rdma_get_src_port(listen_id);
    printf("ephemeral port %d, listener verbs %d\n", sin.sin_port != 0,
           listen_id->verbs != NULL);

    SHOW("create_client", rdma_create_id(cch, &cid, NULL, RDMA_PS_TCP));
    uint8_t tos = 32, ack_timeout = 14;
    SHOW("tos", rdma_set_option(cid, RDMA_OPTION_ID, RDMA_OPTION_ID_TOS, &tos, 1));
    SHOW("tos_long", rdma_set_option(cid, RDMA_OPTION_ID, RDMA_OPTION_ID_TOS, &one, sizeof one));
    SHOW("ack_timeout", rdma_set_option(cid, RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT,
                                        &ack_timeout, 1));
    fcntl(cch->fd, F_SETFL, fcntl(cch->fd, F_GETFL) | O_NONBLOCK);
    SHOW("connect_unresolved", rdma_connect(cid, NULL));
    SHOW("resolve_addr", rdma_resolve_addr(cid, NULL, (struct sockaddr *)&sin, 2000));
    expect(cch, RDMA_CM_EVENT_ADDR_RESOLVED, NULL);
    SHOW("resolve_route", rdma_resolve_route(cid, 2000));
    expect(cch, RDMA_CM_EVENT_ROUTE_RESOLVED, NULL);
    struct sockaddr_in *dst = (struct sockaddr_in *)&cid->route.addr.dst_addr;
    printf("route: verbs %d pd %d port_num %d paths %d path_rec %d dst port ok %d\n",
           cid->verbs != NULL, cid->pd != NULL, cid->port_num, cid->route.num_paths,
           cid->route.path_rec != NULL, dst->sin_port == sin.sin_port);

    struct ibv_qp_init_attr qa = { .cap = { .max_send_wr = 4, .max_recv_wr = 4,
                                            .max_send_sge = 1, .max_recv_sge = 1 },
                                   .qp_type = IBV_QPT_RC };
    SHOW("create_qp", rdma_create_qp(cid, NULL, &qa));
    printf("qp on the id's pd %d, cqs made %d\n", cid->qp && cid->qp->pd == cid->pd,
           cid->send_cq != NULL && cid->recv_cq != NULL);
    SHOW("create_qp_again", rdma_create_qp(cid, NULL, &qa));
    struct ibv_qp_attr attr;
    int mask = 0;
    attr.qp_state = IBV_QPS_INIT;
    SHOW("init_qp_attr_init", rdma_init_qp_attr(cid, &attr, &mask));
    printf("init attrs: state %d port %d\n", (mask & IBV_QP_STATE) != 0, attr.port_num);

    struct rdma_conn_param cp = { .private_data = "hello", .private_data_len = 6,
                                  .responder_resources = 1, .initiator_depth = 1,
                                  .retry_count = 7, .rnr_retry_count = 7 };
    SHOW("connect", rdma_connect(cid, &cp));

    expect(sch, RDMA_CM_EVENT_CONNECT_REQUEST, &ev);
    sid = ev->id;
    printf("request: listen_id %d data %s new id %d verbs %d\n", ev->listen_id == listen_id,
           (const char *)ev->param.conn.private_data, sid != listen_id, sid->verbs != NULL);
    SHOW("server_qp", rdma_create_qp(sid, NULL, &qa));
    cp.private_data = "world";
    SHOW("accept", rdma_accept(sid, &cp));
    SHOW("ack_request", rdma_ack_cm_event(ev));

    expect(cch, RDMA_CM_EVENT_ESTABLISHED, &ev);
    printf("reply data %s\n", (const char *)ev->param.conn.private_data);
    rdma_ack_cm_event(ev);
    expect(sch, RDMA_CM_EVENT_ESTABLISHED, NULL);

    struct ibv_qp_init_attr init;
    memset(&attr, 0, sizeof attr);
    SHOW("query_qp", ibv_query_qp(cid->qp, &attr,
                                  IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_PATH_MTU, &init));
    printf("client qp rts %d timeout %d path mtu %d\n", attr.qp_state == IBV_QPS_RTS,
           attr.timeout, 128 << attr.path_mtu);

    struct rdma_event_channel *shared = sid->channel;
    SHOW("migrate", rdma_migrate_id(sid, NULL));
    printf("own channel %d\n", sid->channel != shared);

    /* The client's DREQ: the server sees DISCONNECTED, and its own rdma_disconnect sends
     * the DREP that gives the client its DISCONNECTED. */
    SHOW("disconnect", rdma_disconnect(cid));
    expect(sid->channel, RDMA_CM_EVENT_DISCONNECTED, &ev);
    SHOW("server_disconnect", rdma_disconnect(sid));
    /* As rping does: the QP rdma_create_qp made destroyed with ibv_destroy_qp before the
     * last event is read (librdmacm must not touch id->qp then). */
    ibv_destroy_qp(cid->qp);
    expect(cch, RDMA_CM_EVENT_DISCONNECTED, NULL);
    /* The server still holds its DISCONNECTED event: destroy waits for the ack. */
    pthread_t t;
    pthread_create(&t, NULL, ack_later, ev);
    rdma_destroy_qp(sid);
    SHOW("destroy_server_id", rdma_destroy_id(sid));
    printf("destroy returned after the ack %d\n", acked);
    pthread_join(t, NULL);

    SHOW("destroy_client", rdma_destroy_id(cid));
    SHOW("destroy_listen", rdma_destroy_id(listen_id));
    rdma_destroy_event_channel(cch);
    rdma_destroy_event_channel(sch);
    return 0;
}
"#;

const EXPECTED: &str = "\
create_listen 0 -
reuseaddr 0 -
reuseaddr_short -1 EINVAL
bind 0 -
listen 0 -
ephemeral port 1, listener verbs 1
create_client 0 -
tos 0 -
tos_long -1 EINVAL
ack_timeout 0 -
connect_unresolved -1 EINVAL
resolve_addr 0 -
RDMA_CM_EVENT_ADDR_RESOLVED status 0
resolve_route 0 -
RDMA_CM_EVENT_ROUTE_RESOLVED status 0
route: verbs 1 pd 1 port_num 1 paths 1 path_rec 1 dst port ok 1
create_qp 0 -
qp on the id's pd 1, cqs made 1
create_qp_again -1 EINVAL
init_qp_attr_init 0 -
init attrs: state 1 port 1
connect 0 -
RDMA_CM_EVENT_CONNECT_REQUEST status 0
request: listen_id 1 data hello new id 1 verbs 1
server_qp 0 -
accept 0 -
ack_request 0 -
RDMA_CM_EVENT_ESTABLISHED status 0
reply data world
RDMA_CM_EVENT_ESTABLISHED status 0
query_qp 0 -
client qp rts 1 timeout 14 path mtu 4096
migrate 0 -
own channel 1
disconnect 0 -
RDMA_CM_EVENT_DISCONNECTED status 0
server_disconnect 0 -
RDMA_CM_EVENT_DISCONNECTED status 0
destroy_server_id 0 -
destroy returned after the ack 1
destroy_client 0 -
destroy_listen 0 -
";

#[test]
fn connect_accept_options_migrate_and_destroy_in_one_process() {
    if !can_build_programs() {
        return;
    }
    let name = "c-cm";
    let exe = build_program(name, &format!("{C_PRELUDE}{PROGRAM}"));
    let out = run_on(&exe, &dropin(name, true));
    assert_eq!(out.stdout, EXPECTED, "stderr:\n{}", out.stderr);
    assert!(out.success, "exit status; stderr:\n{}", out.stderr);
}

/// The same program under valgrind memcheck: no invalid access (the QP destroyed with
/// ibv_destroy_qp before the last event is read included), no definite leak.
#[test]
fn the_same_under_memcheck_is_clean() {
    if !can_build_programs() || !tools_present(&["valgrind"]) {
        return;
    }
    let name = "c-cm-memcheck";
    let exe = build_program(name, &format!("{C_PRELUDE}{PROGRAM}"));
    let out = run_on_under_memcheck(&exe, &dropin(name, true));
    assert_eq!(out.stdout, EXPECTED, "stderr:\n{}", out.stderr);
    assert!(out.success, "memcheck:\n{}", out.stderr);
}

/// Two processes (a fork): the child connects, or accepts, and exits without
/// `rdma_disconnect` or `rdma_destroy_id`, holding a listener and an idle id besides;
/// the parent, its peer, must see DISCONNECTED (10 s bound) and the child exit 0.
const EXIT_PROGRAM: &str = r#"
#include <sys/wait.h>

static double now_ms(void) {
    struct timeval tv;
    gettimeofday(&tv, NULL);
    return tv.tv_sec * 1e3 + tv.tv_usec / 1e3;
}

/* The next event on the non-blocking channel within `ms`, or NULL. */
static struct rdma_cm_event *within(struct rdma_event_channel *ch, double ms) {
    double end = now_ms() + ms;
    for (;;) {
        struct rdma_cm_event *ev = NULL;
        if (rdma_get_cm_event(ch, &ev) == 0)
            return ev;
        if (errno != EAGAIN) {
            fprintf(stderr, "%d get_cm_event: %s\n", getpid(), e(errno));
            exit(1);
        }
        if (now_ms() >= end)
            return NULL;
        struct pollfd p = { .fd = ch->fd, .events = POLLIN };
        poll(&p, 1, 10);
    }
}

static struct rdma_cm_event *expect(struct rdma_event_channel *ch, enum rdma_cm_event_type t) {
    struct rdma_cm_event *ev = within(ch, 10000);
    if (!ev || ev->event != t) {
        fprintf(stderr, "%d wanted %s, got %s\n", getpid(), rdma_event_str(t),
                ev ? rdma_event_str(ev->event) : "nothing in 10 s");
        exit(1);
    }
    return ev;
}

static struct rdma_event_channel *channel(void) {
    struct rdma_event_channel *ch = rdma_create_event_channel();
    if (!ch || fcntl(ch->fd, F_SETFL, fcntl(ch->fd, F_GETFL) | O_NONBLOCK)) {
        fprintf(stderr, "channel: %s\n", e(errno));
        exit(1);
    }
    return ch;
}

static void qp_for(struct rdma_cm_id *id) {
    struct ibv_qp_init_attr qa = { .qp_type = IBV_QPT_RC,
                                   .cap = { .max_send_wr = 1, .max_recv_wr = 1,
                                            .max_send_sge = 1, .max_recv_sge = 1 } };
    if (rdma_create_qp(id, NULL, &qa)) {
        fprintf(stderr, "create_qp: %s\n", e(errno));
        exit(1);
    }
}

/* Listens on 127.0.0.1, an ephemeral port, and writes the port to `fd`; returns the
   accepted id once established. */
static struct rdma_cm_id *accept_one(struct rdma_event_channel *ch, int fd) {
    struct rdma_cm_id *listener;
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(0x7f000001) };
    if (rdma_create_id(ch, &listener, NULL, RDMA_PS_TCP) ||
        rdma_bind_addr(listener, (struct sockaddr *)&a) || rdma_listen(listener, 4)) {
        fprintf(stderr, "listen: %s\n", e(errno));
        exit(1);
    }
    uint16_t port = rdma_get_src_port(listener);
    if (write(fd, &port, sizeof port) != sizeof port)
        exit(1);
    struct rdma_cm_event *ev = expect(ch, RDMA_CM_EVENT_CONNECT_REQUEST);
    struct rdma_cm_id *id = ev->id;
    rdma_ack_cm_event(ev);
    qp_for(id);
    struct rdma_conn_param p = { .responder_resources = 1, .initiator_depth = 1 };
    if (rdma_accept(id, &p)) {
        fprintf(stderr, "accept: %s\n", e(errno));
        exit(1);
    }
    rdma_ack_cm_event(expect(ch, RDMA_CM_EVENT_ESTABLISHED));
    return id;
}

/* Reads the port from `fd` and connects to it. */
static struct rdma_cm_id *connect_one(struct rdma_event_channel *ch, int fd) {
    uint16_t port;
    if (read(fd, &port, sizeof port) != sizeof port)
        exit(1);
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = port,
                             .sin_addr.s_addr = htonl(0x7f000001) };
    struct rdma_cm_id *id;
    if (rdma_create_id(ch, &id, NULL, RDMA_PS_TCP) ||
        rdma_resolve_addr(id, NULL, (struct sockaddr *)&a, 2000)) {
        fprintf(stderr, "resolve: %s\n", e(errno));
        exit(1);
    }
    rdma_ack_cm_event(expect(ch, RDMA_CM_EVENT_ADDR_RESOLVED));
    if (rdma_resolve_route(id, 2000))
        exit(1);
    rdma_ack_cm_event(expect(ch, RDMA_CM_EVENT_ROUTE_RESOLVED));
    qp_for(id);
    struct rdma_conn_param p = { .responder_resources = 1, .initiator_depth = 1,
                                 .retry_count = 7 };
    if (rdma_connect(id, &p)) {
        fprintf(stderr, "connect: %s\n", e(errno));
        exit(1);
    }
    rdma_ack_cm_event(expect(ch, RDMA_CM_EVENT_ESTABLISHED));
    return id;
}

int main(void) {
    int port_pipe[2];
    if (pipe(port_pipe))
        return 1;
    setvbuf(stdout, NULL, _IONBF, 0);
    pid_t child = fork();
    if (child < 0)
        return 1;
    struct rdma_event_channel *ch = channel();
    if (child == 0) {
        struct rdma_cm_id *idle;
        if (rdma_create_id(ch, &idle, NULL, RDMA_PS_TCP))
            return 1;
        if (EXITING_SIDE_ACCEPTS)
            accept_one(ch, port_pipe[1]);
        else
            connect_one(ch, port_pipe[0]);
        /* Leaves without a word: what rdma_destroy_id would send, the exit must. */
        exit(0);
    }
    struct rdma_cm_id *id = EXITING_SIDE_ACCEPTS ? connect_one(ch, port_pipe[0])
                                                 : accept_one(ch, port_pipe[1]);
    printf("established\n");
    struct rdma_cm_event *ev = within(ch, 10000);
    if (!ev) {
        printf("no event in 10 s\n");
    } else {
        printf("%s status %d\n", rdma_event_str(ev->event), ev->status);
        rdma_ack_cm_event(ev);
    }
    int status;
    waitpid(child, &status, 0);
    printf("child exit %d\n", WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    rdma_disconnect(id);
    rdma_destroy_qp(id);
    rdma_destroy_id(id);
    rdma_destroy_event_channel(ch);
    return 0;
}
"#;

/// A peer that exits without destroying its ids is disconnected, as the kernel's
/// rdma_cm does when the exiting process's file closes: the exiting process's exit hook
/// sends the DREQ. Both ways round (the exiting side connected, or accepted).
#[test]
fn a_peer_that_exits_without_destroying_its_id_is_disconnected() {
    if !can_build_programs() {
        return;
    }
    for (name, accepts) in [("c-cm-exit-active", 0), ("c-cm-exit-passive", 1)] {
        let source = format!("{C_PRELUDE}#define EXITING_SIDE_ACCEPTS {accepts}\n{EXIT_PROGRAM}");
        let exe = build_program(name, &source);
        let out = run_on(&exe, &dropin(name, true));
        assert_eq!(
            out.stdout, "established\nRDMA_CM_EVENT_DISCONNECTED status 0\nchild exit 0\n",
            "{name}; stderr:\n{}",
            out.stderr
        );
        assert!(out.success, "{name}; stderr:\n{}", out.stderr);
    }
}
