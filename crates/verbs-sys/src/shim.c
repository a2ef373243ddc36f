/* verbs.h implements the data-path calls as static inline functions that
 * jump through the provider's ops table; bindgen cannot bind those, so this
 * file exports one real function per inline one. Nothing else lives here. */
#include <errno.h>
#include <infiniband/verbs.h>

int dmkit_ibv_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad_wr)
{
	return ibv_post_send(qp, wr, bad_wr);
}

int dmkit_ibv_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad_wr)
{
	return ibv_post_recv(qp, wr, bad_wr);
}

int dmkit_ibv_poll_cq(struct ibv_cq *cq, int num_entries, struct ibv_wc *wc)
{
	return ibv_poll_cq(cq, num_entries, wc);
}

int dmkit_ibv_query_port(struct ibv_context *ctx, uint8_t port, struct ibv_port_attr *attr)
{
	return ibv_query_port(ctx, port, attr);
}

struct ibv_mr *dmkit_ibv_reg_mr(struct ibv_pd *pd, void *addr, size_t length, int access)
{
	return ibv_reg_mr(pd, addr, length, access);
}

struct ibv_td *dmkit_ibv_alloc_td(struct ibv_context *ctx)
{
	struct ibv_td_init_attr attr = { .comp_mask = 0 };
	return ibv_alloc_td(ctx, &attr);
}

int dmkit_ibv_dealloc_td(struct ibv_td *td)
{
	return ibv_dealloc_td(td);
}

struct ibv_pd *dmkit_ibv_alloc_parent_domain(struct ibv_context *ctx, struct ibv_pd *pd, struct ibv_td *td)
{
	struct ibv_parent_domain_init_attr attr = { .pd = pd, .td = td, .comp_mask = 0 };
	return ibv_alloc_parent_domain(ctx, &attr);
}

int dmkit_ibv_query_device_ex(struct ibv_context *ctx, struct ibv_device_attr_ex *attr)
{
	return ibv_query_device_ex(ctx, NULL, attr);
}

int dmkit_ibv_advise_mr_prefetch(struct ibv_pd *pd, uint32_t lkey, uint64_t addr, uint32_t length)
{
	struct ibv_sge sge = { .addr = addr, .length = length, .lkey = lkey };
	return ibv_advise_mr(pd, IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE, IBV_ADVISE_MR_FLAG_FLUSH, &sge, 1);
}
