//! Unmodified rdma-core programs (built against Debian's headers and rdma-core's link
//! libraries) on the drop-in `librdmacm.so.1` + softverbs' `libibverbs.so.1`: what works
//! without the connection manager, and how what needs it fails.
//!
//! Needs `cc`, librdmacm-dev and the workspace's libibverbs cdylib (`cargo build
//! --workspace`); skips loudly without the first two, or fails when
//! `SOFTVERBS_REQUIRE_TOOLS=1` (CI).

mod common;

use common::{build_program, can_build_programs, dropin, run_on, C_PRELUDE};

/// Builds `body` (after the prelude), runs it on the drop-in directory (with softverbs'
/// libibverbs when `ibverbs`), and returns what it printed; None when skipped.
fn run_program(name: &str, body: &str, ibverbs: bool) -> Option<common::Output> {
    if !can_build_programs() {
        return None;
    }
    let exe = build_program(name, &format!("{C_PRELUDE}{body}"));
    let out = run_on(&exe, &dropin(name, ibverbs));
    assert!(
        out.success,
        "{name} failed:\n{}\n{}",
        out.stdout, out.stderr
    );
    Some(out)
}

/// Channels: a real fd, poll, O_NONBLOCK, blocking interrupted by a signal; ids and their
/// lifetimes; what needs the connection manager; the rsocket calls without a connection.
const CHANNELS_AND_IDS: &str = r#"
static int readable(int fd) {
    struct pollfd p = { .fd = fd, .events = POLLIN };
    return poll(&p, 1, 0);
}
static void on_alarm(int sig) { (void)sig; }

int main(void) {
    struct rdma_event_channel *ch = rdma_create_event_channel();
    if (!ch) { printf("no channel: %s\n", e(errno)); return 1; }
    printf("fd valid %d readable %d\n", fcntl(ch->fd, F_GETFD) >= 0, readable(ch->fd));

    struct rdma_cm_event *ev = NULL;
    fcntl(ch->fd, F_SETFL, fcntl(ch->fd, F_GETFL) | O_NONBLOCK);
    SHOW("get_nonblocking", rdma_get_cm_event(ch, &ev));
    fcntl(ch->fd, F_SETFL, fcntl(ch->fd, F_GETFL) & ~O_NONBLOCK);
    /* Blocking on an empty channel: only a signal (no SA_RESTART) ends the wait. */
    struct sigaction sa = { .sa_handler = on_alarm };
    sigemptyset(&sa.sa_mask);
    sigaction(SIGALRM, &sa, NULL);
    struct itimerval t = { .it_value = { .tv_usec = 200000 } };
    setitimer(ITIMER_REAL, &t, NULL);
    SHOW("get_blocking", rdma_get_cm_event(ch, &ev));
    printf("event untouched %d\n", ev == NULL);
    SHOW("get_null_out", rdma_get_cm_event(ch, NULL));
    SHOW("get_bad_channel", rdma_get_cm_event((struct rdma_event_channel *)&t, &ev));
    SHOW("ack_null", rdma_ack_cm_event(NULL));
    struct rdma_cm_event bogus;
    SHOW("ack_bogus", rdma_ack_cm_event(&bogus));

    int ctx;
    struct rdma_cm_id *id = NULL, *ud = NULL, *sync = NULL, *none = NULL;
    SHOW("create_tcp", rdma_create_id(ch, &id, &ctx, RDMA_PS_TCP));
    printf("tcp channel %d context %d ps %#x qp_type %d verbs %d qp %d pd %d event %d\n",
           id->channel == ch, id->context == &ctx, id->ps, id->qp_type, id->verbs == NULL,
           id->qp == NULL, id->pd == NULL, id->event == NULL);
    printf("local family %d port %d, peer family %d port %d\n",
           rdma_get_local_addr(id)->sa_family, ntohs(rdma_get_src_port(id)),
           rdma_get_peer_addr(id)->sa_family, ntohs(rdma_get_dst_port(id)));
    SHOW("create_udp", rdma_create_id(ch, &ud, NULL, RDMA_PS_UDP));
    printf("udp qp_type %d\n", ud->qp_type);
    SHOW("create_bad_ps", rdma_create_id(ch, &none, NULL, 0x1234));
    SHOW("create_null_out", rdma_create_id(ch, NULL, NULL, RDMA_PS_TCP));
    SHOW("create_bad_channel", rdma_create_id((struct rdma_event_channel *)&t, &none, NULL, RDMA_PS_TCP));
    printf("none untouched %d\n", none == NULL);

    /* A synchronous id has a private channel of its own. */
    SHOW("create_sync", rdma_create_id(NULL, &sync, NULL, RDMA_PS_IB));
    printf("sync own channel %d fd valid %d readable %d qp_type %d\n", sync->channel != ch,
           fcntl(sync->channel->fd, F_GETFD) >= 0, readable(sync->channel->fd), sync->qp_type);
    SHOW("create_on_private", rdma_create_id(sync->channel, &none, NULL, RDMA_PS_TCP));
    SHOW("migrate_sync_to_null", rdma_migrate_id(sync, NULL));
    SHOW("migrate_sync_to_channel", rdma_migrate_id(sync, ch));
    printf("sync now on channel %d\n", sync->channel == ch);
    SHOW("migrate_to_private", rdma_migrate_id(id, NULL));
    printf("private %d\n", id->channel != ch && id->channel != NULL);
    SHOW("migrate_back", rdma_migrate_id(id, ch));
    printf("back %d\n", id->channel == ch);

    struct ibv_ece ece = { 0 };
    SHOW("set_ece_no_vendor", rdma_set_local_ece(id, &ece));
    ece.vendor_id = 0x1234;
    ece.options = 5;
    SHOW("set_ece", rdma_set_local_ece(id, &ece));
    SHOW("get_remote_ece", rdma_get_remote_ece(id, &ece));
    printf("remote ece %u %u %u\n", ece.vendor_id, ece.options, ece.comp_mask);

    struct sockaddr_in sin = { .sin_family = AF_INET, .sin_port = htons(7471),
                               .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    SHOW("bind_addr", rdma_bind_addr(id, (struct sockaddr *)&sin));
    SHOW("resolve_addr", rdma_resolve_addr(id, NULL, (struct sockaddr *)&sin, 2000));
    SHOW("listen", rdma_listen(id, 1));
    SHOW("connect", rdma_connect(id, NULL));
    SHOW("bind_unknown_id", rdma_bind_addr((struct rdma_cm_id *)&sin, (struct sockaddr *)&sin));
    SHOW("disconnect_null", rdma_disconnect(NULL));

    rdma_destroy_qp(id);
    rdma_destroy_srq(id);
    SHOW("destroy_tcp", rdma_destroy_id(id));
    SHOW("destroy_again", rdma_destroy_id(id));
    SHOW("destroy_udp", rdma_destroy_id(ud));
    SHOW("destroy_sync", rdma_destroy_id(sync));
    rdma_destroy_ep(NULL);
    int fd = ch->fd;
    rdma_destroy_event_channel(ch);
    printf("closed %d\n", fcntl(fd, F_GETFD) < 0);
    rdma_destroy_event_channel(ch); /* a second time: ignored */

    printf("%s / %s / %s\n", rdma_event_str(RDMA_CM_EVENT_ESTABLISHED),
           rdma_event_str(RDMA_CM_EVENT_ADDR_ERROR), rdma_event_str(-1));

    int rs = rsocket(AF_INET6, SOCK_STREAM, 0);
    printf("rsocket %d fd %d\n", rs >= 0, rs >= 0 && fcntl(rs, F_GETFD) >= 0);
    SHOW("rclose_rsocket", rclose(rs));
    SHOW("rsocket_unix", rsocket(AF_UNIX, SOCK_STREAM, 0));
    SHOW("rsocket_raw", rsocket(AF_INET, SOCK_RAW, 0));
    SHOW("rsend", rsend(3, "x", 1, 0));
    SHOW("rclose", rclose(3));
    SHOW("rfcntl", rfcntl(3, F_SETFL, O_NONBLOCK));
    errno = 0;
    size_t w = riowrite(3, "x", 1, 0, 0);
    printf("riowrite %d %s\n", w == (size_t)-1, e(errno));
    int p[2];
    if (pipe(p)) return 1;
    if (write(p[1], "x", 1) != 1) return 1;
    struct pollfd pf = { .fd = p[0], .events = POLLIN };
    int ready = rpoll(&pf, 1, 1000);
    printf("rpoll %d revents_in %d\n", ready, (pf.revents & POLLIN) != 0);
    return 0;
}
"#;

const CHANNELS_AND_IDS_EXPECTED: &str = "\
fd valid 1 readable 0
get_nonblocking -1 EAGAIN
get_blocking -1 EINTR
event untouched 1
get_null_out -1 EINVAL
get_bad_channel -1 EINVAL
ack_null -1 EINVAL
ack_bogus -1 EINVAL
create_tcp 0 -
tcp channel 1 context 1 ps 0x106 qp_type 2 verbs 1 qp 1 pd 1 event 1
local family 0 port 0, peer family 0 port 0
create_udp 0 -
udp qp_type 4
create_bad_ps -1 EINVAL
create_null_out -1 EINVAL
create_bad_channel -1 EINVAL
none untouched 1
create_sync 0 -
sync own channel 1 fd valid 1 readable 0 qp_type 2
create_on_private -1 EINVAL
migrate_sync_to_null -1 EINVAL
migrate_sync_to_channel 0 -
sync now on channel 1
migrate_to_private 0 -
private 1
migrate_back 0 -
back 1
set_ece_no_vendor -1 EINVAL
set_ece 0 -
get_remote_ece 0 -
remote ece 0 0 0
bind_addr 0 -
resolve_addr 0 -
listen -1 EINVAL
connect -1 EINVAL
bind_unknown_id -1 EINVAL
disconnect_null -1 EINVAL
destroy_tcp 0 -
destroy_again -1 EINVAL
destroy_udp 0 -
destroy_sync 0 -
closed 1
RDMA_CM_EVENT_ESTABLISHED / RDMA_CM_EVENT_ADDR_ERROR / UNKNOWN EVENT
rsocket 1 fd 1
rclose_rsocket 0 -
rsocket_unix -1 ENOTSUP
rsocket_raw -1 ENOTSUP
rsend -1 EBADF
rclose -1 EBADF
rfcntl -1 EBADF
riowrite 1 EBADF
rpoll 1 revents_in 1
";

#[test]
fn channels_ids_and_what_needs_the_cm() {
    let Some(out) = run_program("channels-ids", CHANNELS_AND_IDS, true) else {
        return;
    };
    assert_eq!(out.stdout, CHANNELS_AND_IDS_EXPECTED);
    // softverbs' libibverbs has the connection manager: nothing to explain.
    assert!(
        !out.stderr.contains("no connection manager"),
        "stderr:\n{}",
        out.stderr
    );
}

/// `rdma_get_devices` hands out contexts of softverbs' libibverbs (opened through its public
/// API), the same device the program lists itself, usable with the verbs.
const DEVICES: &str = r#"
int main(void) {
    int n = -1;
    struct ibv_context **list = rdma_get_devices(&n);
    if (!list) { printf("no list: %s\n", e(errno)); return 1; }
    printf("devices %d end %d name %s\n", n, list[n] == NULL, ibv_get_device_name(list[0]->device));
    int own = 0;
    struct ibv_device **devs = ibv_get_device_list(&own);
    printf("same device as ibv_get_device_list %d\n", own == 1 && devs[0] == list[0]->device);
    ibv_free_device_list(devs);
    struct ibv_pd *pd = ibv_alloc_pd(list[0]);
    struct ibv_cq *cq = ibv_create_cq(list[0], 4, NULL, NULL, 0);
    printf("pd %d cq %d\n", pd != NULL, cq != NULL);
    ibv_destroy_cq(cq);
    ibv_dealloc_pd(pd);
    struct ibv_context **again = rdma_get_devices(NULL);
    printf("same context again %d\n", again && again[0] == list[0]);
    rdma_free_devices(again);
    rdma_free_devices(list);
    return 0;
}
"#;

#[test]
fn rdma_get_devices_gives_softverbs_contexts() {
    let Some(out) = run_program("devices", DEVICES, true) else {
        return;
    };
    assert_eq!(
        out.stdout,
        "devices 1 end 1 name softverbs0\n\
         same device as ibv_get_device_list 1\n\
         pd 1 cq 1\n\
         same context again 1\n"
    );
}

/// `rdma_getaddrinfo` as rdma-core's addrinfo.c: numeric and named hosts, services,
/// RAI_PASSIVE, RAI_NUMERICHOST, the hints' QP type and port space, IPv4, IPv6, AF_IB, the
/// addresses-in-hints form, and its errors.
const GETADDRINFO: &str = r#"
static void addr(const char *what, const struct sockaddr *sa, socklen_t len) {
    char buf[INET6_ADDRSTRLEN];
    if (!sa) { printf(" %s -", what); return; }
    switch (sa->sa_family) {
    case AF_INET: {
        const struct sockaddr_in *s = (const void *)sa;
        printf(" %s %s:%d/%u", what, inet_ntop(AF_INET, &s->sin_addr, buf, sizeof buf),
               ntohs(s->sin_port), len);
        break;
    }
    case AF_INET6: {
        const struct sockaddr_in6 *s = (const void *)sa;
        printf(" %s [%s]:%d/%u", what, inet_ntop(AF_INET6, &s->sin6_addr, buf, sizeof buf),
               ntohs(s->sin6_port), len);
        break;
    }
    case AF_IB: {
        const struct sockaddr_ib *s = (const void *)sa;
        printf(" %s ib %s pkey %#x sid %#llx mask %#llx/%u", what,
               inet_ntop(AF_INET6, &s->sib_addr, buf, sizeof buf), ntohs(s->sib_pkey),
               (unsigned long long)be64toh(s->sib_sid),
               (unsigned long long)be64toh(s->sib_sid_mask), len);
        break;
    }
    default:
        printf(" %s family %d", what, sa->sa_family);
    }
}

static void show(const char *what, const char *node, const char *service,
                 const struct rdma_addrinfo *hints) {
    struct rdma_addrinfo *res = NULL;
    errno = 0;
    int ret = rdma_getaddrinfo(node, service, hints, &res);
    if (ret) {
        printf("%s ret %d %s\n", what, ret,
               ret == -1 ? e(errno) : ret == EAI_NONAME ? "EAI_NONAME" : "other");
        return;
    }
    printf("%s flags %d family %d qp %d ps %#x", what, res->ai_flags, res->ai_family,
           res->ai_qp_type, res->ai_port_space);
    addr("src", res->ai_src_addr, res->ai_src_len);
    addr("dst", res->ai_dst_addr, res->ai_dst_len);
    printf(" next %d route %d connect %d\n", res->ai_next == NULL, res->ai_route_len == 0,
           res->ai_connect_len == 0);
    rdma_freeaddrinfo(res);
}

/* Where the answer depends on the machine (named hosts, no hints), it is the system
 * resolver's first answer for the hints rdma-core's addrinfo.c translates to. */
static void same_as_getaddrinfo(const char *what, const char *node, const char *service,
                                const struct rdma_addrinfo *hints,
                                const struct addrinfo *ai_hints) {
    struct rdma_addrinfo *res = NULL;
    struct addrinfo *ai = NULL;
    int r1 = rdma_getaddrinfo(node, service, hints, &res);
    int r2 = getaddrinfo(node, service, ai_hints, &ai);
    int passive = ai && (ai->ai_flags & AI_PASSIVE);
    struct sockaddr *got = res ? (passive ? res->ai_src_addr : res->ai_dst_addr) : NULL;
    socklen_t len = res ? (passive ? res->ai_src_len : res->ai_dst_len) : 0;
    int qp = ai && ai->ai_socktype == SOCK_DGRAM ? IBV_QPT_UD : IBV_QPT_RC;
    int ps = ai && ai->ai_protocol == IPPROTO_UDP ? RDMA_PS_UDP : RDMA_PS_TCP;
    printf("%s same %d\n", what,
           r1 == 0 && r2 == 0 && res->ai_family == ai->ai_family && len == ai->ai_addrlen &&
           memcmp(got, ai->ai_addr, len) == 0 && res->ai_qp_type == qp &&
           res->ai_port_space == ps && res->ai_flags == (passive ? RAI_PASSIVE : 0));
    if (res) rdma_freeaddrinfo(res);
    if (ai) freeaddrinfo(ai);
}

int main(void) {
    struct rdma_addrinfo h;

    memset(&h, 0, sizeof h);
    h.ai_flags = RAI_NUMERICHOST;
    h.ai_port_space = RDMA_PS_TCP;
    show("v4", "127.0.0.1", "7471", &h);

    memset(&h, 0, sizeof h);
    h.ai_flags = RAI_PASSIVE;
    h.ai_family = AF_INET;
    h.ai_port_space = RDMA_PS_TCP;
    show("passive-any", NULL, "7471", &h);
    show("passive-host", "127.0.0.1", "7174", &h);

    memset(&h, 0, sizeof h);
    h.ai_flags = RAI_NUMERICHOST;
    h.ai_qp_type = IBV_QPT_UD;
    h.ai_port_space = RDMA_PS_UDP;
    show("v6-ud", "::1", "7174", &h);

    memset(&h, 0, sizeof h);
    h.ai_flags = RAI_PASSIVE | RAI_NUMERICHOST;
    h.ai_family = AF_INET6;
    show("v6-passive", "::", "18515", &h);

    show("no-hints", "127.0.0.1", NULL, NULL);
    same_as_getaddrinfo("service-only", NULL, "7471", NULL, NULL);

    memset(&h, 0, sizeof h);
    h.ai_qp_type = IBV_QPT_XRC_SEND;
    h.ai_port_space = RDMA_PS_IB;
    show("ps-ib-xrc", "127.0.0.1", "7471", &h);

    memset(&h, 0, sizeof h);
    h.ai_flags = RAI_NUMERICHOST;
    show("numeric-name", "localhost", "7471", &h);
    show("nothing", NULL, NULL, NULL);

    /* No node or service: the hints' addresses are copied. */
    struct sockaddr_in dst = { .sin_family = AF_INET, .sin_port = htons(99) };
    struct sockaddr_in src = { .sin_family = AF_INET };
    inet_pton(AF_INET, "10.1.2.3", &dst.sin_addr);
    inet_pton(AF_INET, "127.0.0.1", &src.sin_addr);
    memset(&h, 0, sizeof h);
    h.ai_family = AF_INET;
    h.ai_qp_type = IBV_QPT_UD;
    h.ai_port_space = RDMA_PS_UDP;
    h.ai_dst_addr = (struct sockaddr *)&dst;
    h.ai_dst_len = sizeof dst;
    h.ai_src_addr = (struct sockaddr *)&src;
    h.ai_src_len = sizeof src;
    show("from-hints", NULL, NULL, &h);
    /* A source in the hints is kept beside a looked-up destination. */
    h.ai_flags = RAI_NUMERICHOST;
    h.ai_dst_addr = NULL;
    h.ai_dst_len = 0;
    show("src-from-hints", "127.0.0.2", "7471", &h);

    memset(&h, 0, sizeof h);
    h.ai_flags = RAI_FAMILY | RAI_NUMERICHOST;
    h.ai_family = AF_IB;
    h.ai_port_space = RDMA_PS_TCP;
    show("af-ib", "fe80::1:2", "7471", &h);
    show("af-ib-v4", "127.0.0.1", "7471", &h);

    struct rdma_addrinfo tcp = { .ai_port_space = RDMA_PS_TCP };
    struct addrinfo ai_tcp = { .ai_protocol = IPPROTO_TCP };
    same_as_getaddrinfo("localhost", "localhost", "7471", &tcp, &ai_tcp);
    tcp.ai_flags = RAI_PASSIVE;
    ai_tcp.ai_flags = AI_PASSIVE;
    same_as_getaddrinfo("localhost-passive", "localhost", "7471", &tcp, &ai_tcp);
    struct rdma_addrinfo ud = { .ai_qp_type = IBV_QPT_UD };
    struct addrinfo ai_ud = { .ai_socktype = SOCK_DGRAM };
    same_as_getaddrinfo("localhost-ud", "localhost", "7174", &ud, &ai_ud);
    return 0;
}
"#;

const GETADDRINFO_EXPECTED: &str = "\
v4 flags 0 family 2 qp 2 ps 0x106 src - dst 127.0.0.1:7471/16 next 1 route 1 connect 1
passive-any flags 1 family 2 qp 2 ps 0x106 src 0.0.0.0:7471/16 dst - next 1 route 1 connect 1
passive-host flags 1 family 2 qp 2 ps 0x106 src 127.0.0.1:7174/16 dst - next 1 route 1 connect 1
v6-ud flags 0 family 10 qp 4 ps 0x111 src - dst [::1]:7174/28 next 1 route 1 connect 1
v6-passive flags 1 family 10 qp 2 ps 0x106 src [::]:18515/28 dst - next 1 route 1 connect 1
no-hints flags 0 family 2 qp 2 ps 0x106 src - dst 127.0.0.1:0/16 next 1 route 1 connect 1
service-only same 1
ps-ib-xrc flags 0 family 2 qp 9 ps 0x13f src - dst 127.0.0.1:7471/16 next 1 route 1 connect 1
numeric-name ret -2 EAI_NONAME
nothing ret -1 EINVAL
from-hints flags 0 family 2 qp 4 ps 0x111 src 127.0.0.1:0/16 dst 10.1.2.3:99/16 next 1 route 1 connect 1
src-from-hints flags 0 family 2 qp 4 ps 0x111 src 127.0.0.1:0/16 dst 127.0.0.2:7471/16 next 1 route 1 connect 1
af-ib flags 0 family 27 qp 2 ps 0x106 src - dst ib fe80::1:2 pkey 0xffff sid 0x1061d2f mask 0xffffffffffffffff/48 next 1 route 1 connect 1
af-ib-v4 ret -1 EINVAL
localhost same 1
localhost-passive same 1
localhost-ud same 1
";

#[test]
fn rdma_getaddrinfo_behaves_as_rdma_core() {
    let Some(out) = run_program("getaddrinfo", GETADDRINFO, true) else {
        return;
    };
    assert_eq!(out.stdout, GETADDRINFO_EXPECTED);
}

/// With rdma-core's own libibverbs.so.1 loaded (softverbs' drop-in directory not first),
/// librdmacm fails as rdma-core's does on a machine without RDMA devices, and says why.
const FOREIGN: &str = r#"
int main(void) {
    struct rdma_event_channel *ch = rdma_create_event_channel();
    printf("channel %s %s\n", ch ? "created" : "NULL", ch ? "-" : e(errno));
    struct rdma_addrinfo *res = NULL;
    SHOW("getaddrinfo", rdma_getaddrinfo("127.0.0.1", "7471", NULL, &res));
    struct rdma_cm_id *id = NULL;
    SHOW("create_id", rdma_create_id(NULL, &id, NULL, RDMA_PS_TCP));
    int n = -1;
    struct ibv_context **list = rdma_get_devices(&n);
    printf("devices %s %d\n", list ? "list" : "NULL", n);
    return 0;
}
"#;

#[test]
fn with_rdma_cores_libibverbs_it_says_what_is_wrong() {
    let kernel_devices = std::fs::read_dir("/sys/class/infiniband")
        .map(|d| d.count())
        .unwrap_or(0);
    if kernel_devices > 0 {
        common::skip(
            "this machine has kernel RDMA devices; rdma-core's libibverbs would list them",
        );
        return;
    }
    let Some(out) = run_program("foreign-ibverbs", FOREIGN, false) else {
        return;
    };
    assert_eq!(
        out.stdout,
        "channel NULL ENODEV\n\
         getaddrinfo -1 ENODEV\n\
         create_id -1 ENODEV\n\
         devices NULL 0\n"
    );
    let said: Vec<&str> = out
        .stderr
        .lines()
        .filter(|l| l.starts_with("librdmacm.so.1 (softverbs): no RDMA device"))
        .collect();
    assert_eq!(said.len(), 1, "stderr:\n{}", out.stderr);
    assert!(
        said[0].contains("has no softverbs_private_cm@SOFTVERBS_PRIVATE_1: it is not softverbs'")
            && said[0].contains("softverbs run"),
        "{}",
        said[0]
    );
    assert!(
        !said[0].contains("dropin"),
        "rdma-core's library was loaded: {}",
        said[0]
    );
}

/// valgrind memcheck over the programs above: no memory error and no definite leak, in the
/// library or the program (which frees all it gets).
#[test]
fn memcheck_finds_nothing() {
    if !common::tools_present(&["valgrind"]) || !can_build_programs() {
        return;
    }
    for (name, body) in [
        ("memcheck-channels-ids", CHANNELS_AND_IDS),
        ("memcheck-getaddrinfo", GETADDRINFO),
        ("memcheck-devices", DEVICES),
    ] {
        let exe = build_program(name, &format!("{C_PRELUDE}{body}"));
        let out = common::run_on_under_memcheck(&exe, &dropin(name, true));
        assert!(out.success, "{name} under memcheck:\n{}", out.stderr);
    }
}
