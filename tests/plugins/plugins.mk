# Test plugins for tests/test_registry.c, built into $(BUILD)/tests/plugins/.
# They compile with -Iinclude only: a plugin must build against include/vspec/ alone.
TEST_PLUGIN_DIR := $(BUILD)/tests/plugins
TEST_PLUGINS := $(TEST_PLUGIN_DIR)/testrule_v1.so $(TEST_PLUGIN_DIR)/testrule_v2.so \
                $(TEST_PLUGIN_DIR)/testrule_abi2.so $(TEST_PLUGIN_DIR)/nosym.so

TEST_PLUGIN_CC = $(CC) -Iinclude $(PLUGIN_CFLAGS) $(1) $< -o $@ $(PLUGIN_LDFLAGS)

$(TEST_PLUGIN_DIR)/testrule_v1.so: tests/plugins/testrule.c $(wildcard include/vspec/*.h)
	@mkdir -p $(dir $@)
	$(call TEST_PLUGIN_CC,-DTEST_VALUE=1)
$(TEST_PLUGIN_DIR)/testrule_v2.so: tests/plugins/testrule.c $(wildcard include/vspec/*.h)
	@mkdir -p $(dir $@)
	$(call TEST_PLUGIN_CC,-DTEST_VALUE=2)
$(TEST_PLUGIN_DIR)/testrule_abi2.so: tests/plugins/testrule.c $(wildcard include/vspec/*.h)
	@mkdir -p $(dir $@)
	$(call TEST_PLUGIN_CC,-DTEST_VALUE=1 -DVSPEC_ABI_MAJOR=2)
# Its init fails and it may not be unloaded (the registry's init-failure test).
TEST_PLUGINS += $(TEST_PLUGIN_DIR)/testrule_initfail.so
$(TEST_PLUGIN_DIR)/testrule_initfail.so: tests/plugins/testrule.c $(wildcard include/vspec/*.h)
	@mkdir -p $(dir $@)
	$(call TEST_PLUGIN_CC,-DTEST_VALUE=3 -DTEST_INIT_FAIL)
$(TEST_PLUGIN_DIR)/nosym.so: tests/plugins/nosym.c
	@mkdir -p $(dir $@)
	$(call TEST_PLUGIN_CC,)

TEST_PLUGINS += $(TEST_PLUGIN_DIR)/backend_table.so
$(TEST_PLUGIN_DIR)/backend_table.so: tests/plugins/backend_table.c $(wildcard include/vspec/*.h)
	@mkdir -p $(dir $@)
	$(call TEST_PLUGIN_CC,)

# The daemon tests' slow scheduler (installed as sched_slow.so).
TEST_PLUGINS += $(TEST_PLUGIN_DIR)/slowsched.so
$(TEST_PLUGIN_DIR)/slowsched.so: tests/plugins/slowsched.c $(wildcard include/vspec/*.h)
	@mkdir -p $(dir $@)
	$(call TEST_PLUGIN_CC,)
# The same, 300 ms to load (installed as sched_slowload.so): holds vspecd's loop in a reload.
TEST_PLUGINS += $(TEST_PLUGIN_DIR)/slowload.so
$(TEST_PLUGIN_DIR)/slowload.so: tests/plugins/slowsched.c $(wildcard include/vspec/*.h)
	@mkdir -p $(dir $@)
	$(call TEST_PLUGIN_CC,-DSS_INIT_MS=300 -DSS_NAME='"slowload"')

# The Jacobi drafter with a planted fault (a carried-over draft judged against a distribution it
# was not drawn from), as drafter_jacobi_wrong.so: tests/test_sd_exact.c shows its chi-square
# test catches it.
TEST_PLUGINS += $(TEST_PLUGIN_DIR)/drafter_jacobi_wrong.so
$(TEST_PLUGIN_DIR)/drafter_jacobi_wrong.so: plugins/drafter/jacobi.c $(wildcard include/vspec/*.h)
	@mkdir -p $(dir $@)
	$(call TEST_PLUGIN_CC,-DJACOBI_PLANTED_FAULT '-DJACOBI_NAME="jacobi_wrong"') -lm
