"""What the repository's hand-written C++ toolchains (tools/wasm: Emscripten;
tools/fuzz: clang with libFuzzer and sanitizers) share: the action groups
their flags apply to, and a flag_set helper."""

load("@bazel_tools//tools/build_defs/cc:action_names.bzl", "ACTION_NAMES")
load("@bazel_tools//tools/cpp:cc_toolchain_config_lib.bzl", "flag_group", "flag_set", "with_feature_set")

# Every action that compiles a source file.
COMPILE_ACTIONS = [
    ACTION_NAMES.assemble,
    ACTION_NAMES.preprocess_assemble,
    ACTION_NAMES.c_compile,
    ACTION_NAMES.cpp_compile,
    ACTION_NAMES.cpp_header_parsing,
    ACTION_NAMES.cpp_module_compile,
    ACTION_NAMES.cpp_module_codegen,
]

# The C++-only subset (for -std=c++17 and the like).
CXX_ACTIONS = [
    ACTION_NAMES.cpp_compile,
    ACTION_NAMES.cpp_header_parsing,
    ACTION_NAMES.cpp_module_compile,
    ACTION_NAMES.cpp_module_codegen,
]

# Every link of an executable or a shared library.
LINK_ACTIONS = [
    ACTION_NAMES.cpp_link_executable,
    ACTION_NAMES.cpp_link_dynamic_library,
    ACTION_NAMES.cpp_link_nodeps_dynamic_library,
]

def flags(actions, flag_list, features = None):
    """A flag_set adding `flag_list` to `actions`, only under `features` when given."""
    return flag_set(
        actions = actions,
        flag_groups = [flag_group(flags = flag_list)],
        with_features = [with_feature_set(features = features)] if features else [],
    )
