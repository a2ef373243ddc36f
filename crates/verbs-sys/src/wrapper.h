#include <infiniband/verbs.h>

/* Exported copies of verbs.h's static inline functions (see shim.c). */
int dmkit_ibv_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad_wr);
int dmkit_ibv_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad_wr);
int dmkit_ibv_poll_cq(struct ibv_cq *cq, int num_entries, struct ibv_wc *wc);
int dmkit_ibv_query_port(struct ibv_context *ctx, uint8_t port, struct ibv_port_attr *attr);
struct ibv_mr *dmkit_ibv_reg_mr(struct ibv_pd *pd, void *addr, size_t length, int access);
struct ibv_td *dmkit_ibv_alloc_td(struct ibv_context *ctx);
int dmkit_ibv_dealloc_td(struct ibv_td *td);
struct ibv_pd *dmkit_ibv_alloc_parent_domain(struct ibv_context *ctx, struct ibv_pd *pd, struct ibv_td *td);
int dmkit_ibv_query_device_ex(struct ibv_context *ctx, struct ibv_device_attr_ex *attr);
int dmkit_ibv_advise_mr_prefetch(struct ibv_pd *pd, uint32_t lkey, uint64_t addr, uint32_t length);
