#!/bin/sh
# A checkout of deepseek-ai/DeepSpec (MIT), DeepSeek's DSpark code, for the tests that hold this package's DSpark
# drafter against it (tests/models/test_dspark_deepspec.py). Nothing of it enters the repository.
#   scripts/fetch_deepspec.sh [DIR]          (default: ./.deepspec)
#   SPECDEC_DEEPSPEC_DIR=DIR python -m pytest -q tests/models/test_dspark_deepspec.py
# It needs transformers (the project's dev extra installs it) and imports on a CPU.
set -eu
dir=${1:-.deepspec}
if [ -d "$dir/.git" ]; then
    git -C "$dir" pull --ff-only
else
    git clone --depth 1 https://github.com/deepseek-ai/DeepSpec.git "$dir"
fi
echo "SPECDEC_DEEPSPEC_DIR=$(cd "$dir" && pwd)"
