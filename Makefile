# The README's commands. Each one does its own set-up (idempotent, seconds the second time).
PY := .venv/bin/python

.PHONY: setup build test bench dlrm clean

setup:
	bash scripts/setup_env.sh

build: setup

# The whole suite, multi-worker tests (horovodrun -np 2 --gloo) included.
test: setup
	$(PY) -m pytest -q tests

# The main job: DLRM on a generated Criteo-format dataset, 2 Horovod workers on CPU.
dlrm: setup
	bash tutorials/DLRM_Benchmark/run_cpu_demo.sh

# CPU benchmarks against the competitors (TFRA installed beside, benchmark-only), results
# under benchmarks/results/.
bench: setup
	$(PY) -c "import tensorflow_recommenders_addons" 2>/dev/null || \
	  $(PY) -m pip install -q --no-deps -r benchmarks/requirements.txt
	$(PY) benchmarks/cpu/c1_fused_lookup.py
	$(PY) benchmarks/cpu/c2_c3_hash_table.py
	$(PY) benchmarks/cpu/c4_dynamic_training.py
	$(PY) benchmarks/cpu/c5_interaction.py
	$(PY) benchmarks/cpu/c6_dlrm.py
	$(PY) benchmarks/run.py

clean:
	rm -rf build sparse_operation_kit/lib
