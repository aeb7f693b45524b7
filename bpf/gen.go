package bpf

// The eBPF objects are compiled by bpf2go (clang, libbpf-dev headers) into *_bpfel.o, which the
// generated *_bpfel.go embed; both are committed so that `go build` needs no clang. Regenerate
// with `go generate ./bpf/` after changing anything under c/. The two -I directories hold the
// asm/ headers of Debian's linux-libc-dev on x86_64 and arm64 (clang ignores the missing one);
// the objects are the same on both.

//go:generate go tool bpf2go -tags linux -target bpfel -output-stem lb_sock -type lb_svc_key -type lb_svc_val -type lb_backend -type lb_revnat_key -type lb_revnat_val -type lb_aff_key lbSock c/lb_sock.c -- -O2 -g -Wall -Werror -I/usr/include/x86_64-linux-gnu -I/usr/include/aarch64-linux-gnu
//go:generate go tool bpf2go -tags linux -target bpfel -output-stem lb_destroy -type lb_target lbDestroy c/lb_destroy.c -- -O2 -g -Wall -Werror -I/usr/include/x86_64-linux-gnu -I/usr/include/aarch64-linux-gnu
//go:generate go tool bpf2go -tags linux -target bpfel -output-stem counters -type subnet_key -type cluster_stats counters c/counters.c -- -O2 -g -Wall -Werror -I/usr/include/x86_64-linux-gnu -I/usr/include/aarch64-linux-gnu
