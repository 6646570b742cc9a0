// What the three stages share through GstLatentBase (elements/gstlatentbase.h): one base type,
// the `model`/`device`/`dtype` properties owned by it, their refusal while PAUSED/PLAYING, and
// device validation when the property is set.
#include <gtest/gtest.h>

#include <string>

#include "tests/elements/gst_test_util.h"

namespace {

using namespace gsttest;

::testing::Environment* const kEnv = ::testing::AddGlobalTestEnvironment(new GstEnvironment());

const char* const kStages[] = {"vaeencode", "vaedecode", "ditdenoise"};

GType base_type() {
  // Registered when the first stage's class is made.
  GstElement* e = gst_element_factory_make("vaeencode", nullptr);
  gst_object_unref(e);
  return g_type_from_name("GstLatentBase");
}

// The next WARNING message on `bw`'s bus, with its debug text after " | ", or "".
std::string pop_warning(BusWatch& bw) {
  GstMessage* m = gst_bus_timed_pop_filtered(bw.bus(), 0, GST_MESSAGE_WARNING);
  if (!m) return "";
  GError* err = nullptr;
  gchar* dbg = nullptr;
  gst_message_parse_warning(m, &err, &dbg);
  std::string out = err ? err->message : "";
  if (dbg) out += std::string(" | ") + dbg;
  g_clear_error(&err);
  g_free(dbg);
  gst_message_unref(m);
  return out;
}

std::string string_property(gpointer object, const char* name) {
  gchar* v = nullptr;
  g_object_get(object, name, &v, nullptr);
  std::string out = v ? v : "";
  g_free(v);
  return out;
}

TEST(LatentBase, EveryStageDerivesFromTheBase) {
  const GType base = base_type();
  ASSERT_NE(base, G_TYPE_INVALID);
  for (const char* stage : kStages) {
    GstElement* e = gst_element_factory_make(stage, nullptr);
    ASSERT_NE(e, nullptr) << stage;
    EXPECT_TRUE(g_type_is_a(G_OBJECT_TYPE(e), base)) << stage << " is not a GstLatentBase";
    gst_object_unref(e);
  }
}

TEST(LatentBase, ModelDeviceAndDtypeAreTheBasesProperties) {
  const GType base = base_type();
  for (const char* stage : kStages) {
    GstElement* e = gst_element_factory_make(stage, nullptr);
    ASSERT_NE(e, nullptr);
    for (const char* name : {"model", "device", "dtype"}) {
      GParamSpec* p = g_object_class_find_property(G_OBJECT_GET_CLASS(e), name);
      ASSERT_NE(p, nullptr) << stage << " has no " << name;
      EXPECT_EQ(p->owner_type, base) << stage << "'s " << name << " is its own copy";
      EXPECT_TRUE(p->flags & GST_PARAM_MUTABLE_READY) << stage << " " << name;
    }
    gst_object_unref(e);
  }
}

TEST(LatentBase, PlanPropertiesBelongToTheVaeStagesOnly) {
  for (const char* stage : {"vaeencode", "vaedecode"}) {
    GstElement* e = gst_element_factory_make(stage, nullptr);
    guint depth = 0;
    g_object_get(e, "prefetch-depth", &depth, nullptr);
    EXPECT_EQ(depth, 2u) << stage;
    g_object_set(e, "prefetch-depth", 5u, "cuda-graphs", FALSE, nullptr);
    g_object_get(e, "prefetch-depth", &depth, nullptr);
    EXPECT_EQ(depth, 5u) << stage;
    EXPECT_FALSE(bool_property(e, "cuda-graphs")) << stage;
    gst_object_unref(e);
  }
  // ditdenoise plans no VAE part and stages no frames: it offers no setting that would do nothing.
  GstElement* dit = gst_element_factory_make("ditdenoise", nullptr);
  EXPECT_EQ(g_object_class_find_property(G_OBJECT_GET_CLASS(dit), "prefetch-depth"), nullptr);
  EXPECT_EQ(g_object_class_find_property(G_OBJECT_GET_CLASS(dit), "cuda-graphs"), nullptr);
  gst_object_unref(dit);
}

TEST(LatentBase, ADeviceThatIsNoDeviceIsRefusedWhenSet) {
  for (const char* stage : kStages) {
    SCOPED_TRACE(stage);
    GstElement* e = gst_element_factory_make(stage, nullptr);
    BusWatch bw(e);
    g_object_set(e, "device", "cpu", nullptr);
    g_object_set(e, "device", "tpu", nullptr);
    EXPECT_EQ(string_property(e, "device"), "cpu");  // the value in effect stays
    const std::string w = pop_warning(bw);
    EXPECT_TRUE(contains(w, "'tpu'")) << w;
    EXPECT_TRUE(contains(w, "cuda:N")) << w;
    EXPECT_TRUE(contains(w, stage)) << w;
    // Every real spelling is taken (whether the device exists is start()'s question).
    for (const char* ok : {"auto", "", "cuda", "cuda:1", "cpu"}) {
      g_object_set(e, "device", ok, nullptr);
      EXPECT_EQ(string_property(e, "device"), ok);
    }
    EXPECT_EQ(pop_warning(bw), "");
    gst_object_unref(e);
  }
}

// model, device and dtype are in use from PAUSED on: a change then is refused with a warning
// naming the value that stays in effect, and reading the property gives that value.
TEST(LatentBase, ModelDeviceAndDtypeAreRefusedWhilePlaying) {
  GstHarness* h = harness_for("vaeencode", {{"model", taesd_model()}, {"device", "cpu"}});
  ASSERT_NE(h, nullptr);
  gst_harness_set_src_caps(h, video_caps(32, 32));
  ASSERT_EQ(gst_harness_push(h, make_frame(32, 32)), GST_FLOW_OK);
  gst_buffer_unref(gst_harness_pull(h));
  BusWatch bw(h->element);
  g_object_set(h->element, "model", flux_model().c_str(), nullptr);
  EXPECT_EQ(string_property(h->element, "model"), taesd_model());
  std::string w = pop_warning(bw);
  EXPECT_TRUE(contains(w, "`model` cannot change while PAUSED or PLAYING")) << w;
  EXPECT_TRUE(contains(w, taesd_model())) << w;
  g_object_set(h->element, "device", "auto", "dtype", "bf16", nullptr);
  EXPECT_EQ(string_property(h->element, "device"), "cpu");
  EXPECT_EQ(string_property(h->element, "dtype"), "");
  EXPECT_TRUE(contains(pop_warning(bw), "`device`"));
  EXPECT_TRUE(contains(pop_warning(bw), "`dtype`"));
  // The stage still runs the model it started with.
  ASSERT_EQ(gst_harness_push(h, make_frame(32, 32)), GST_FLOW_OK);
  GstCaps* caps = output_caps(h);
  ASSERT_NE(caps, nullptr);
  EXPECT_EQ(caps_str(gst_caps_get_structure(caps, 0), "latent-space"), "sd");
  gst_caps_unref(caps);
  gst_buffer_unref(gst_harness_pull(h));

  // Back in READY the change is taken.
  gst_element_set_state(h->element, GST_STATE_READY);
  g_object_set(h->element, "model", flux_model().c_str(), nullptr);
  EXPECT_EQ(string_property(h->element, "model"), flux_model());
  EXPECT_EQ(pop_warning(bw), "");
  gst_harness_teardown(h);
}

}  // namespace
