// The individual model builders behind BuildModel (internal to models/).
// Each adds the whole network to an empty *g; options are complete (defaults
// filled in). Shape errors are recorded in g->status().
#ifndef PSTRAIN_MODELS_BUILDERS_H_
#define PSTRAIN_MODELS_BUILDERS_H_

#include <string>

#include "common/status.h"
#include "models/models.h"
#include "nn/graph.h"

namespace pstrain::models {

Status BuildMlp(const ModelOptions& o, Graph* g);
Status BuildLenet(const ModelOptions& o, Graph* g);
Status BuildInceptionBn28Small(const ModelOptions& o, Graph* g);
Status BuildInceptionBn(const ModelOptions& o, Graph* g);
Status BuildResnet(const ModelOptions& o, Graph* g);
Status BuildInceptionV3(const ModelOptions& o, Graph* g);
Status BuildKerasMnistCnn(const ModelOptions& o, Graph* g);
Status BuildNeonCifar10Conv(const ModelOptions& o, Graph* g);

// Shorthands shared by the builders.
ConvParam Conv(int filters, int kh, int kw, int sh = 1, int sw = 1, int ph = 0, int pw = 0,
               bool no_bias = false);
PoolParam Pool(PoolType type, int k, int s, int pad = 0,
               PoolConvention conv = PoolConvention::kValid);

}  // namespace pstrain::models

#endif  // PSTRAIN_MODELS_BUILDERS_H_
