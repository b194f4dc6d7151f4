// UCX links and runs: a UCP context and worker are created, the worker's address is packed,
// and everything is released in reverse order.
#include <ucp/api/ucp.h>

#include "gtest/gtest.h"

namespace {

TEST(UcxSmoke, ContextAndWorker) {
  ucp_config_t* config = nullptr;
  ASSERT_EQ(ucp_config_read(nullptr, nullptr, &config), UCS_OK);

  ucp_params_t params = {};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_AM | UCP_FEATURE_RMA;
  ucp_context_h context = nullptr;
  ucs_status_t st = ucp_init(&params, config, &context);
  ucp_config_release(config);
  ASSERT_EQ(st, UCS_OK) << ucs_status_string(st);

  ucp_worker_params_t wparams = {};
  wparams.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wparams.thread_mode = UCS_THREAD_MODE_SINGLE;
  ucp_worker_h worker = nullptr;
  st = ucp_worker_create(context, &wparams, &worker);
  ASSERT_EQ(st, UCS_OK) << ucs_status_string(st);

  ucp_address_t* address = nullptr;
  size_t address_length = 0;
  st = ucp_worker_get_address(worker, &address, &address_length);
  ASSERT_EQ(st, UCS_OK) << ucs_status_string(st);
  EXPECT_GT(address_length, 0u);
  ucp_worker_release_address(worker, address);

  ucp_worker_destroy(worker);
  ucp_cleanup(context);
}

}  // namespace
