# The README's commands. Each one does its own set-up (idempotent, seconds the second time).
PY := .venv/bin/python
# Test processes (pytest-xdist), the tests spread over them; TEST_WORKERS=0 runs them all in
# one process.
TEST_WORKERS ?= 2
PYTEST := -m pytest -q -n $(TEST_WORKERS)

.PHONY: setup setup-tf2.16 setup-tf2.21 build test test-tf2.15 test-tf2.16 test-tf2.21 \
	test-tf2.21-keras3 test-tf2.21-tf-keras smoke bench dlrm clean

setup:
	bash scripts/setup_env.sh

build: setup

setup-tf2.16:
	SOK_TF=2.16 bash scripts/setup_env.sh

setup-tf2.21:
	SOK_TF=2.21 bash scripts/setup_env.sh

# The whole suite, multi-worker tests (horovodrun -np 2 --gloo) included, under TensorFlow
# 2.15.1 (Keras 2) and 2.21.0 with Keras 3; the Keras-facing tests under 2.21.0 with tf_keras
# (one venv, both Keras); then the lines in between built and smoke-tested.
test: test-tf2.15 test-tf2.21-keras3 test-tf2.21-tf-keras smoke

# With SOK_DISCARD_VENVS=1 (CI sets it) a venv and its build folder are removed as soon as
# nothing later in `make test` needs them, so the disk holds at most three TensorFlow installs.
discard = if [ -n "$${SOK_DISCARD_VENVS:-}" ]; then rm -rf $(1); fi

test-tf2.15: setup
	$(PY) $(PYTEST) tests
	$(call discard,.venv build/tf2.15)

test-tf2.16: setup-tf2.16
	TF_USE_LEGACY_KERAS=1 .venv-tf2.16/bin/python $(PYTEST) tests

test-tf2.21: setup-tf2.21
	TF_USE_LEGACY_KERAS=1 .venv-tf2.21/bin/python $(PYTEST) tests

test-tf2.21-keras3: setup-tf2.21
	env -u TF_USE_LEGACY_KERAS .venv-tf2.21/bin/python $(PYTEST) tests

# The tests whose subject is Keras (optimizers, layers and models, checkpoints, the SOK v2
# drop-in script, the API surface, the version check): what changes when tf_keras replaces
# Keras 3 on the same TensorFlow. The rest runs under 2.15.1 with tf_keras and 2.21.0 with
# Keras 3 (`make test-tf2.21` runs all of it with tf_keras).
KERAS_TESTS := tests/optimizers tests/models/test_layers.py \
	tests/checkpoints/test_checkpoint_files.py tests/dynamic/test_dynamic_variable_api.py \
	tests/sok_dropin/test_sok_dropin_script.py tests/package/test_api.py \
	tests/package/test_sok_surface.py tests/package/test_info.py
# A SOK v2 script's results are compared with TensorFlow 2.16.2's (what the GPU machines run).
test-tf2.21-tf-keras: setup-tf2.21 setup-tf2.16
	TF_USE_LEGACY_KERAS=1 SOK_REFERENCE_PYTHON=.venv-tf2.16/bin/python \
	  .venv-tf2.21/bin/python $(PYTEST) $(KERAS_TESTS)
	$(call discard,.venv-tf2.21 build/tf2.21)

# TensorFlow 2.16 (what the GPU machines run) to 2.20 with tf_keras: the op library and
# Horovod built against each, and the API, dynamic-table, optimizer-surface, layer and
# interaction tests run, with 2 Horovod workers against one on static and dynamic tables, a
# localized dump and load, and a mixed plan.
SMOKE_TESTS := tests/package/test_api.py tests/dynamic/test_dynamic.py \
	tests/optimizers/test_optimizer_surface.py tests/models/test_layers.py \
	tests/models/test_interaction.py \
	'tests/multiworker/test_multiworker.py::test_static_tables_match_single_worker_reference[True-adagrad]' \
	'tests/multiworker/test_multiworker.py::test_dynamic_tables_match_single_worker_reference[True-adagrad]' \
	tests/multiworker/test_multiworker.py::test_unnamed_localized_dynamic_tables_dump_and_load_on_two_workers \
	tests/multiworker/test_multiworker.py::test_plan_with_dp_localized_and_distributed_groups_matches_single_worker
smoke:
	for line in 2.16 2.17 2.18 2.19 2.20; do \
	  SOK_TF=$$line bash scripts/setup_env.sh && \
	  TF_USE_LEGACY_KERAS=1 .venv-tf$$line/bin/python $(PYTEST) $(SMOKE_TESTS) || exit 1; \
	  $(call discard,.venv-tf$$line build/tf$$line); \
	done

# The main job: DLRM on a generated Criteo-format dataset, 2 Horovod workers on CPU.
dlrm: setup
	bash tutorials/DLRM_Benchmark/run_cpu_demo.sh

# CPU benchmarks C1-C6 against the competitors (TFRA installed beside, benchmark-only). Results
# go to the untracked benchmarks/out/, compared with benchmarks/baselines.json; publishing them
# into benchmarks/results/ is a separate, deliberate step: $(PY) benchmarks/run.py --publish
bench: setup
	$(PY) -c "import tensorflow_recommenders_addons" 2>/dev/null || \
	  $(PY) -m pip install -q --no-deps -r benchmarks/requirements.txt
	$(PY) benchmarks/run.py --run

clean:
	rm -rf build build-gpu sparse_operation_kit/lib
