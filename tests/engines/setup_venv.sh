#!/usr/bin/env bash
# Create .engines-venv: mooncake-py (editable, with its dev tools), CPU torch, and the serving
# engines whose Mooncake store modules the tests in tests/engines drive.
#
# The engines go in with --no-deps: their full dependency sets pull GPU kernels and
# conflicting pins (sglang and vllm pin different torch, openai and xgrammar releases), and
# none of that is on the store path. ENGINE_IMPORT_DEPS below is what importing the three
# store modules and building the objects the tests build actually needs, found by importing
# and adding each missing module until the imports succeed. torchvision is not among them:
# PyPI's wheels link libtorch_cuda.so, so tests/engines/stubs stands in for it at import.
#
# Usage: tests/engines/setup_venv.sh        (ENGINES_VENV=path to put the venv elsewhere)
set -euo pipefail

cd "$(dirname "$0")/../.."
VENV="${ENGINES_VENV:-.engines-venv}"
PY="$VENV/bin/python"

TORCH="torch==2.13.0"
ENGINES=(sglang==0.5.23 vllm==0.33.0 lmcache==0.5.6)
ENGINE_IMPORT_DEPS=(
    aiofile==3.12.3 aiohappyeyeballs==2.7.1 aiohttp==3.14.5 aiosignal==1.4.0
    annotated-doc==0.0.7 annotated-types==0.8.0 anyio==4.16.0 apache-tvm-ffi==0.1.11
    attrs==26.1.0 cachetools==8.0.2 caio==0.12.10 cbor2==6.3.0 certifi==2026.10.19.post1
    cffi==2.1.1 cloudpickle==3.1.3 compressed-tensors==0.18.0 cryptography==50.0.2
    dill==0.4.1 distro==1.9.0 einops==0.8.2 fastapi==0.136.3 frozenlist==1.8.0 gguf==0.19.0
    h11==0.16.0 httpcore2==2.16.2 httpx==0.28.1 httpx2==2.16.2 huggingface-hub==2.4.0
    idna==3.20 ipython==9.18.1 llguidance==1.9.1 llvmlite==0.50.0 loguru==0.7.3
    msgspec==0.23.0 multidict==7.2.1 numba==0.65.1 openai==3.57.0 openai-harmony==0.0.4
    orjson==3.13.0 partial-json-parser==0.2.1.1.post7 pillow==13.0.0 propcache==0.5.4 psutil==7.2.2
    py-cpuinfo==9.0.0 pybase64==1.5.1 pydantic==2.14.4 pydantic-core==2.50.5 pyzmq==27.3.0
    regex==2026.11.19 requests==2.34.2 safetensors==0.8.0 sentencepiece==0.2.1
    sniffio==1.3.1 starlette==1.10.0 tokenizers==0.23.2 tqdm==4.70.1 traitlets==5.16.1
    transformers==5.19.0 triton==3.9.0 truststore==0.10.5 typing-inspection==0.4.5
    urllib3==2.8.0 uvloop==0.23.0 xgrammar==0.2.7 yarl==1.25.1
)

start=$(date +%s)
python3 -m venv "$VENV"
"$PY" -m pip install -q --upgrade pip
"$PY" -m pip install -q -e '.[dev]'
# A CPU build: PyPI's default torch wheel is the CUDA one elsewhere, so fall back to the
# CPU index when plain pip does not give "+cpu".
"$PY" -m pip install -q "$TORCH"
if ! "$PY" -c 'import sys, torch; sys.exit(torch.version.cuda is not None)'; then
    "$PY" -m pip install -q --force-reinstall --no-deps "$TORCH" \
        --index-url https://download.pytorch.org/whl/cpu
fi
"$PY" -m pip install -q --no-deps "${ENGINES[@]}"
"$PY" -m pip install -q --no-deps "${ENGINE_IMPORT_DEPS[@]}"

# Every store module the tests drive must import against mooncake-py.
PYTHONPATH="tests/engines/shim:tests/engines/stubs" CUDA_VISIBLE_DEVICES="" \
    VLLM_TARGET_DEVICE=cpu "$PY" - <<'PYCHECK'
import importlib
import warnings

warnings.simplefilter("ignore")
for module in (
    "mooncake.store",
    "sglang.srt.mem_cache.storage.mooncake_store.mooncake_store",
    "sglang.srt.mem_cache.storage.mooncake_store.mooncake_embedding_store",
    "sglang.srt.mem_cache.storage.mooncake_store.mooncake_direct_linker",
    "vllm.distributed.kv_transfer.kv_connector.v1.mooncake.store.worker",
    "lmcache.v1.storage_backend.connector.mooncakestore_connector",
):
    importlib.import_module(module)
print("engine store modules import")
PYCHECK

touch "$VENV/.installed"
echo "$VENV ready in $(( $(date +%s) - start )) s, $(du -sh "$VENV" | cut -f1)"
