/* Outgoing loopback connections from one address: an LD_PRELOAD for the Grid Engine sandbox.
 *
 * Several execution daemons share one machine there, each under its own host name with its
 * own loopback address (127.0.0.2 host1, ...). The qmaster names a connecting daemon by the
 * address the connection comes from, and refuses one whose name does not match ("IP based
 * host name resolving ... doesn't match"); a socket left unbound connects from 127.0.0.1.
 * This library binds each unbound IPv4 socket to $CLUSTERJOB_GE_SOURCE_ADDRESS (port 0: any)
 * just before it connects to a loopback address. Other destinations are left alone.
 *
 * Built by `clusterjob sandbox up --scheduler gridengine` with the system's cc:
 *     cc -shared -fPIC -O2 -Wall -o gridengine_source_address.so gridengine_source_address.c -ldl
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

typedef int (*connect_fn)(int, const struct sockaddr *, socklen_t);

static int is_loopback(const struct sockaddr *addr, socklen_t len)
{
    if (addr == NULL || len < (socklen_t)sizeof(struct sockaddr_in) || addr->sa_family != AF_INET)
        return 0;
    const struct sockaddr_in *in = (const struct sockaddr_in *)addr;
    return (ntohl(in->sin_addr.s_addr) >> 24) == 127;
}

static int is_unbound(int fd)
{
    struct sockaddr_in own;
    socklen_t len = sizeof(own);
    memset(&own, 0, sizeof(own));
    if (getsockname(fd, (struct sockaddr *)&own, &len) != 0 || own.sin_family != AF_INET)
        return 0;
    return own.sin_port == 0 && own.sin_addr.s_addr == htonl(INADDR_ANY);
}

__attribute__((visibility("default"))) int connect(int fd, const struct sockaddr *addr,
                                                   socklen_t len)
{
    static connect_fn real_connect;
    if (real_connect == NULL)
        real_connect = (connect_fn)dlsym(RTLD_NEXT, "connect");
    if (real_connect == NULL) {
        errno = ENOSYS;
        return -1;
    }
    const char *source = getenv("CLUSTERJOB_GE_SOURCE_ADDRESS");
    if (source != NULL && *source != '\0' && is_loopback(addr, len) && is_unbound(fd)) {
        struct sockaddr_in from;
        memset(&from, 0, sizeof(from));
        from.sin_family = AF_INET;
        from.sin_port = 0;
        if (inet_pton(AF_INET, source, &from.sin_addr) == 1) {
            int saved = errno;
            /* a failed bind (address not local) leaves the socket as it was: connect anyway */
            (void)bind(fd, (const struct sockaddr *)&from, sizeof(from));
            errno = saved;
        }
    }
    return real_connect(fd, addr, len);
}
