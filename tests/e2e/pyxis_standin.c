/* A stand-in for pyxis's SPANK options: registers --container-image and --container-mounts
 * as pyxis does, so srun accepts them and hands them to the job step; it starts no
 * container. In the step it exports what it was given, for the test to read. */
#include <slurm/spank.h>
#include <stdlib.h>
#include <string.h>

SPANK_PLUGIN(pyxis_standin, 1);

static char *image;
static char *mounts;

static int set_image(int val, const char *arg, int remote)
{
    (void)val; (void)remote;
    free(image);
    image = strdup(arg ? arg : "");
    return 0;
}

static int set_mounts(int val, const char *arg, int remote)
{
    (void)val; (void)remote;
    free(mounts);
    mounts = strdup(arg ? arg : "");
    return 0;
}

struct spank_option spank_options[] = {
    {"container-image", "[USER@][REGISTRY#]IMAGE[:TAG]|PATH",
     "[pyxis stand-in] the image to run the task in", 1, 0, set_image},
    {"container-mounts", "SRC:DST[:FLAGS][,SRC:DST...]",
     "[pyxis stand-in] bind mounts into the container", 1, 0, set_mounts},
    SPANK_OPTIONS_TABLE_END
};

int slurm_spank_user_init(spank_t sp, int ac, char **av)
{
    (void)ac; (void)av;
    if (image)
        spank_setenv(sp, "PYXIS_STANDIN_IMAGE", image, 1);
    if (mounts)
        spank_setenv(sp, "PYXIS_STANDIN_MOUNTS", mounts, 1);
    return 0;
}
