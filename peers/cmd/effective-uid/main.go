// Command effective-uid prints the effective user id it runs with, as
// "Effective uid: N". Installed setuid root in the stand-in of critest's
// nonewprivs image (integration/src/critest.rs): run as a non-root user, it
// prints 0 when the setuid bit took effect and the user's id when the
// container's no_new_privs kept it from doing so.
package main

import (
	"fmt"
	"os"
)

func main() {
	fmt.Printf("Effective uid: %d\n", os.Geteuid())
}
