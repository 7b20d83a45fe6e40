import org.apache.kafka.common.config.ConfigDef;
import java.util.*;
public class KafkaBrokerConfigs {
  public static void main(String[] a) throws Exception {
    ConfigDef def = kafka.server.KafkaConfig$.MODULE$.configDef();
    TreeMap<String, ConfigDef.ConfigKey> keys = new TreeMap<>(def.configKeys());
    for (var e : keys.entrySet()) {
      ConfigDef.ConfigKey k = e.getValue();
      String v = k.validator == null ? "" : k.validator.toString().replace("\t"," ").replace("\n"," ");
      System.out.println(e.getKey() + "\t" + k.type + "\t" + (k.internalConfig ? "internal" : "") + "\t" + v);
    }
  }
}
