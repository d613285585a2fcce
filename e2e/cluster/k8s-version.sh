# shellcheck shell=bash
# Sourced after versions.env: select_kubernetes_version REQUESTED sets KUBERNETES_VERSION and
# KUBERNETES_STAGING_VERSION. REQUESTED is empty (the default of versions.env), a full version (v1.34.12) or a
# minor listed in KUBERNETES_VERSIONS (1.34, v1.34). Kept apart so build.sh, up.sh and run-e2e.sh agree.
select_kubernetes_version() {
    local want="${1:-}" v
    if [[ -z "$want" ]]; then return 0; fi
    want="v${want#v}"
    if [[ "$want" =~ ^v1\.[0-9]+$ ]]; then
        local found=""
        IFS=, read -r -a _tested <<<"$KUBERNETES_VERSIONS"
        for v in "${_tested[@]}"; do
            [[ "$v" == "$want".* ]] && found="$v"
        done
        if [[ -z "$found" ]]; then
            echo "KUBERNETES_VERSION=$1: no $want.x in KUBERNETES_VERSIONS ($KUBERNETES_VERSIONS) of versions.env;" \
                "name a full version such as ${want}.0" >&2
            return 1
        fi
        want="$found"
    fi
    if [[ ! "$want" =~ ^v1\.[0-9]+\.[0-9]+$ ]]; then
        echo "KUBERNETES_VERSION=$1 is not a Kubernetes release (want v1.MINOR.PATCH, a minor like 1.34, or all)" >&2
        return 1
    fi
    if [[ "$want" != "$KUBERNETES_VERSION" ]]; then
        KUBERNETES_VERSION="$want"
        # Staging modules carry the same minor and patch with major 0 (k8s.io/api v0.37.2 for v1.37.2).
        KUBERNETES_STAGING_VERSION="v0.${want#v1.}"
    fi
    export KUBERNETES_VERSION KUBERNETES_STAGING_VERSION
}
