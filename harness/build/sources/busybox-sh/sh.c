/* /bin/sh of the locally built e2e busybox image.
 *
 * Upstream's busybox image runs ash, whose messages the conformance specs
 * match ("/bin/sh: can't create /file: Read-only file system"), and ash
 * there passes environment variables whose names are not shell identifiers
 * (envFrom keys such as "data-1") on to commands. Debian's busybox ash drops
 * those. So: busybox ash, unless the environment holds such a name; then
 * bash-static, which keeps them.
 */
#include <ctype.h>
#include <stdio.h>
#include <unistd.h>

extern char **environ;

static int identifier(const char *kv) {
    const char *p = kv;
    if (!(isalpha((unsigned char)*p) || *p == '_'))
        return 0;
    for (p++; *p && *p != '='; p++)
        if (!(isalnum((unsigned char)*p) || *p == '_'))
            return 0;
    return 1;
}

int main(int argc, char **argv) {
    (void)argc;
    for (char **e = environ; *e; e++) {
        if (!identifier(*e)) {
            execv("/bin/bash", argv);
            perror("/bin/bash");
            return 127;
        }
    }
    execv("/bin/busybox", argv); /* argv[0] ends in "sh": the ash applet */
    perror("/bin/busybox");
    return 127;
}
